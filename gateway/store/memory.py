"""The embedded store: limit state in this process, bounded by each zone's ``size``.

Zones hold one packed int per key in an LRU-ordered dict, and count their
memory as ``ENTRY_COST + len(key)`` bytes per key (``ENTRY_COST`` is measured by
``scripts/bench_memory.py``). Inserting a key follows nginx's zone rules
(``ngx_http_limit_req_expire``), with one deliberate difference:

* first look at the least recently used key up to twice, and drop it if it has
  been idle 60 s and is fully drained;
* if the zone is still full, drop the LRU key by force (plus up to two more
  idle, drained ones), as nginx does;
* unlike nginx, if that still leaves no room (the new key is longer than the
  ones dropped), keep dropping LRU keys by force until it fits. nginx would fail
  the request ("could not allocate node"), which lets a flood of long keys turn
  a full zone into 503s for every new client. Only a key that could not fit in
  an empty zone is an ERROR, and key extractors keep keys under ``max_key``
  (``gateway/http/keys.py``), far below the smallest zone.

Count zones drop expired windows the same way and evict by force until the new
key fits. Conn zones never evict (they would drop in-flight counts): a full conn
zone rejects new keys, like nginx.

Everything here is synchronous; inside one event loop a decision is atomic.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gateway.clock import monotonic_ms
from gateway.config.zones import ZoneSpec
from gateway.limits import conn as conn_logic
from gateway.limits import count as count_logic
from gateway.limits import nginx_req, sliding_count
from gateway.limits.algo import AlgoType
from gateway.limits.conn import ConnDecision
from gateway.limits.outcome import AlgoOutcome
from gateway.limits.params import CountParams
from gateway.limits.registry import algo_type
from gateway.store.base import AlgoUse, LimitSet, Verdict

# Bytes one key costs beyond its own length: OrderedDict slot and list node, the key
# object and the packed int: 164 bytes at 1M keys, 189 just after the table doubles
# (CPython 3.11, 64-bit; scripts/bench_memory.py). The worst case keeps `size` a bound.
ENTRY_COST = 192


class _LruZone:
    """States by key, least recently used first, charged ENTRY_COST + len(key) against ``size``."""

    kind: str

    def __init__(self, spec: ZoneSpec) -> None:
        self.nodes: OrderedDict[bytes, Any] = OrderedDict()
        self.used = 0
        self.reconfigure(spec)

    def reconfigure(self, spec: ZoneSpec) -> None:
        self.spec = spec
        self.size = spec.size
        while self.used > self.size and self.nodes:
            self._drop_lru()

    def get(self, key: bytes) -> int | None:
        state = self.nodes.get(key)
        if state is not None:
            self.nodes.move_to_end(key)
        return state

    def key_cost(self, key: bytes) -> int:
        return ENTRY_COST + len(key)

    def _drop(self, key: bytes) -> None:
        del self.nodes[key]
        self.used -= self.key_cost(key)

    def _drop_lru(self) -> None:
        self._drop(next(iter(self.nodes)))

    def __len__(self) -> int:
        return len(self.nodes)


class ReqZone(_LruZone):
    """A limit_req zone: implements ``nginx_req.ReqTable``."""

    kind = "req"

    def reconfigure(self, spec: ZoneSpec) -> None:
        assert spec.rate is not None
        self.rate_m = spec.rate.rate_m
        super().reconfigure(spec)

    def peek(self, key: bytes) -> int | None:
        return self.nodes.get(key)

    def put(self, key: bytes, state: int) -> None:
        self.nodes[key] = state

    def delete(self, key: bytes) -> None:
        if self.nodes.pop(key, None) is not None:
            self.used -= ENTRY_COST + len(key)

    def insert(self, key: bytes, state: int, now: int) -> bool:
        cost = ENTRY_COST + len(key)
        if cost > self.size:
            return False
        self._expire(now, forced=False)
        if self.used + cost > self.size:
            self._expire(now, forced=True)
            while self.used + cost > self.size and self.nodes:
                self._drop_lru()
        self.nodes[key] = state
        self.used += cost
        return True

    def _expire(self, now: int, *, forced: bool) -> None:
        n = 0 if forced else 1
        while n < 3 and self.nodes:
            key, state = next(iter(self.nodes.items()))
            if n != 0 and not nginx_req.expirable(state, now, self.rate_m):
                return
            n += 1
            self._drop(key)


class CountZone(_LruZone):
    kind = "count"

    def expired(self, state: int, now: int) -> bool:
        if self.spec.window_type == "sliding":
            return sliding_count.expired(state, now, self.spec.window_ms)
        return count_logic.expired(state, now)

    def store(self, key: bytes, state: int, now: int) -> None:
        if key in self.nodes:
            self.nodes[key] = state
            return
        cost = self.key_cost(key)
        if cost > self.size:  # it could not fit even alone (keys are far shorter: max_key)
            return
        for _ in range(2):  # drop expired windows at the LRU end
            if not self.nodes:
                break
            old_key, old_state = next(iter(self.nodes.items()))
            if not self.expired(old_state, now):
                break
            self._drop(old_key)
        while self.used + cost > self.size and self.nodes:
            self._drop_lru()
        self.nodes[key] = state
        self.used += cost


class AlgoZone(CountZone):
    """A zone of the newer algorithms: its type's state per key (``gateway.limits.registry``).

    A key is charged its type's ``extra_bytes`` beyond the fixed cost (a sliding_log pays for a
    full log up front), so ``size`` stays a bound whatever the states hold.
    """

    def __init__(self, spec: ZoneSpec) -> None:
        self.extra = 0
        super().__init__(spec)

    def reconfigure(self, spec: ZoneSpec) -> None:
        self.kind = spec.type
        self.algo: AlgoType = algo_type(spec.type)
        self.params = self.algo.params_of(spec)
        extra = self.algo.extra_bytes(self.params)
        if self.nodes and extra != self.extra:
            self.nodes.clear()  # the charge per key changes: start over rather than miscount
            self.used = 0
        self.extra = extra
        super().reconfigure(spec)

    def key_cost(self, key: bytes) -> int:
        return ENTRY_COST + len(key) + self.extra

    def expired(self, state: Any, now: int) -> bool:
        return self.algo.expired(self.params, state, now)


class ConnZone:
    """A limit_conn zone: implements ``conn.ConnTable``."""

    kind = "conn"

    def __init__(self, spec: ZoneSpec) -> None:
        self.counts: dict[bytes, int] = {}
        self.used = 0
        self.reconfigure(spec)

    def reconfigure(self, spec: ZoneSpec) -> None:
        self.spec = spec
        self.size = spec.size

    def acquire(self, key: bytes, limit: int) -> int:
        count = self.counts.get(key)
        if count is None:
            cost = ENTRY_COST + len(key)
            if self.used + cost > self.size:
                return -1
            self.used += cost
            self.counts[key] = 1
            return 1
        if count >= limit:
            return 0
        self.counts[key] = count + 1
        return count + 1

    def release(self, key: bytes) -> None:
        count = self.counts.get(key)
        if count is None:
            return
        if count <= 1:
            del self.counts[key]
            self.used -= ENTRY_COST + len(key)
        else:
            self.counts[key] = count - 1

    def __len__(self) -> int:
        return len(self.counts)


Zone = ReqZone | CountZone | ConnZone | AlgoZone
# the nginx kinds; every other type is one of limits: (gateway.limits.registry)
_KINDS: dict[str, Any] = {"req": ReqZone, "count": CountZone, "conn": ConnZone}


def _same_keys(old: ZoneSpec, new: ZoneSpec) -> bool:
    """Whether a reloaded zone's keys mean what they meant: then its state is kept."""
    return (
        old.type == new.type
        and old.window_type == new.window_type  # a fixed and a sliding count pack their state differently
        and old.key == new.key
        and old.max_key == new.max_key
        and old.ipv6_prefix == new.ipv6_prefix
    )


def _zone(zones: dict[str, Zone], name: str, kind: str) -> Any:
    """The zone a limit names; KeyError if it is gone or changed type (a reload under way)."""
    zone = zones[name]
    if zone.kind != kind:
        raise KeyError(f'zone "{name}" is now a {zone.kind} zone')
    return zone


def _count_step(state: int | None, now: int, limit: CountParams) -> count_logic.CountStep:
    """A fixed window, or APISIX's sliding estimate reported as used = limit - remaining."""
    if not limit.sliding:
        return count_logic.check(state, now, limit)
    step = sliding_count.check(state, now, limit)
    used = limit.limit - max(0, step.remaining) if step.allowed else limit.limit
    return count_logic.CountStep(step.allowed, used, step.reset_ms, step.state)


_Tables = tuple[list[ReqZone], list[CountZone], list[ConnZone], list[AlgoZone]]


class MemoryStore:
    """Limit state for one process (one node when the gateway runs one worker)."""

    kind = "memory"
    on_error = "allow"  # never raised: the state is here

    def __init__(self, clock_ms: Callable[[], int] = monotonic_ms) -> None:
        self.clock_ms = clock_ms
        self.zones: dict[str, Zone] = {}
        # id(route) -> (route, its tables); the route is kept to make a reused id harmless
        self._tables: dict[int, tuple[LimitSet, _Tables]] = {}

    def configure(self, zones: Mapping[str, ZoneSpec]) -> None:
        """Keep a zone's state across reloads when its type and key are unchanged (as nginx does)."""
        fresh: dict[str, Zone] = {}
        for name, spec in zones.items():
            current = self.zones.get(name)
            if current is not None and _same_keys(current.spec, spec):
                current.reconfigure(spec)
                fresh[name] = current
            else:
                fresh[name] = _KINDS.get(spec.type, AlgoZone)(spec)
        self.zones = fresh
        self._tables.clear()

    async def start(self) -> None:
        """Nothing to connect to."""

    def status(self) -> dict[str, Any]:
        if not self.zones:
            return {}
        zones = {
            name: {"type": zone.kind, "keys": len(zone), "bytes": zone.used, "size": zone.size}
            for name, zone in self.zones.items()
        }
        return {"zones": zones}

    def deliver_bans(self, sink: Any) -> bool:
        return False

    def _route_tables(self, route: LimitSet) -> _Tables:
        cached = self._tables.get(id(route))
        if cached is not None and cached[0] is route:
            return cached[1]
        z = self.zones
        tables = (
            [_zone(z, lim.zone, "req") for lim in route.limit_req],
            [_zone(z, lim.zone, "count") for lim in route.limit_count],
            [_zone(z, lim.zone, "conn") for lim in route.limit_conn],
            [_zone(z, lim.zone, lim.type) for lim in route.limit_algo],
        )
        self._tables[id(route)] = (route, tables)
        return tables

    # -- the store interface -------------------------------------------------------------------
    async def admit(
        self,
        route: LimitSet,
        req_keys: Sequence[bytes],
        count_keys: Sequence[bytes],
        conn_keys: Sequence[bytes],
        algo: Sequence[AlgoUse] = (),
    ) -> Verdict:
        return self.decide(route, req_keys, count_keys, conn_keys, algo)

    async def acquire_conn(self, route: LimitSet, conn_keys: Sequence[bytes]) -> ConnDecision:
        return self.take_conn(route, conn_keys)

    def release(self, route: LimitSet, decision: ConnDecision) -> None:
        if decision.taken:
            conn_logic.release(decision.taken)
            decision.taken = []

    async def close(self) -> None:
        return None

    # -- synchronous core (also used by the shared store of a multi-worker node) --------------
    def decide(
        self,
        route: LimitSet,
        req_keys: Sequence[bytes],
        count_keys: Sequence[bytes],
        conn_keys: Sequence[bytes],
        algo: Sequence[AlgoUse] = (),
    ) -> Verdict:
        now = self.clock_ms()
        req_tables, count_tables, _, algo_tables = self._route_tables(route)
        verdict = Verdict(now_ms=now)
        dry = route.dry_run
        req = None
        if route.limit_req:
            req = nginx_req.decide(route.limit_req, req_tables, req_keys, now)
            verdict.req = req
            if req.rc >= nginx_req.BUSY and not dry:
                return verdict
        steps: list[count_logic.CountStep | None] = []
        if route.limit_count:
            used: list[int | None] = []
            reset: list[int | None] = []
            for i, limit in enumerate(route.limit_count):
                key = count_keys[i]
                if not key:
                    steps.append(None)
                    used.append(None)
                    reset.append(None)
                    continue
                step = _count_step(count_tables[i].get(key), now, limit)
                steps.append(step)
                used.append(step.used)
                reset.append(step.reset_ms)
                if not step.allowed and verdict.count_rejected < 0:
                    verdict.count_rejected = i
                    if not dry:
                        break
            verdict.count_used = used
            verdict.count_reset_ms = reset
            if verdict.count_rejected >= 0 and not dry:
                if req is not None:
                    nginx_req.discard(req, req_tables)
                return verdict
        algo_states: list[Any] = []
        if route.limit_algo:
            algo_states = self._decide_algo(route, algo_tables, algo, now, verdict)
            if verdict.algo_rejected >= 0 and not dry:
                if req is not None:
                    nginx_req.discard(req, req_tables)
                return verdict
            for i, state in enumerate(algo_states):
                if state is not None:
                    algo_tables[i].store(algo[i][0], state, now)
        if route.limit_count:
            for i, maybe in enumerate(steps):
                if maybe is not None and maybe.allowed:
                    count_tables[i].store(count_keys[i], maybe.state, now)
        if req is not None and req.rc == nginx_req.OK:
            nginx_req.commit(req, req_tables)
        if route.limit_conn:
            waits = (req is not None and req.delay_ms > 0) or (
                bool(verdict.algo) and any(a is not None and a.delay_ms for a in verdict.algo)
            )
            if not waits or dry:
                verdict.conn = self.take_conn(route, conn_keys)
        return verdict

    def _decide_algo(
        self, route: LimitSet, tables: list[AlgoZone], algo: Sequence[AlgoUse], now: int, verdict: Verdict
    ) -> list[Any]:
        """Each zone's answer into ``verdict``; the states to store if the request goes on."""
        states: list[Any] = []
        outcomes: list[AlgoOutcome | None] = []
        for i, limit in enumerate(route.limit_algo):
            key, cost = algo[i]
            if not key:
                states.append(None)
                outcomes.append(None)
                continue
            outcome, state = limit.algo.decide(limit.params, tables[i].get(key), now, cost)
            outcomes.append(outcome)
            states.append(state)
            if not outcome.allowed and verdict.algo_rejected < 0:
                verdict.algo_rejected = i
                if not route.dry_run:
                    break
        verdict.algo = outcomes + [None] * (len(route.limit_algo) - len(outcomes))
        return states

    def take_conn(self, route: LimitSet, conn_keys: Sequence[bytes]) -> ConnDecision:
        return conn_logic.acquire(self._route_tables(route)[2], conn_keys, [c.max for c in route.limit_conn])
