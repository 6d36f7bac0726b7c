"""The embedded store: limit state in this process, bounded by each zone's ``size``.

Zones hold one state per key and count their memory as ``ENTRY_COST + len(key)``
bytes per key (``ENTRY_COST`` is measured by ``scripts/bench_memory.py``), in two
classes, so that a client cannot get its own state evicted by flooding other keys:

* **free** keys are not limited: a limit_req key with an empty bucket whose next
  request would pass (a one-shot client under a burst; losing it wins its client at
  most the one request nginx charges a new key nothing for). They are kept least
  recently used first and evicted like nginx's zones (``ngx_http_limit_req_expire``):
  up to two idle, drained ones (60 s), then by force until the new key fits;
* **held** keys are limited or banned: a limit_req key with excess, at its limit
  (refused, or its next request would be) or banned; a count window; the state of
  a ``limits:`` type. They are never evicted for a new key, and stay held until
  their state lapses (a request would fare as a new key's, the window or ban is
  over): a full zone then drops them, looking at a few per new key, oldest first,
  and moving on in turn.

When neither class can make room, the new key is refused, as nginx refuses a node
it cannot allocate: limit_req answers ERROR (503, "could not allocate node" in the
error log), a count or ``limits:`` zone rejects the request with its status and says
so in the error log at most once a second. Why refuse rather than evict held keys last: an
attacker who can make keys cheaply can make them held as cheaply (one request in a
1-per-hour count zone), so any order that ends in evicting held keys ends in
evicting the attacker's own. Refusing costs new keys while the zone is full of live
state; ``size`` bounds that, and the flood that fills it passes no more than it
would have anyway. A ban lives in its key's held state, so eviction cannot lift it.

Conn zones never evict (they would drop in-flight counts): a full conn zone rejects
new keys, like nginx.

Everything here is synchronous; inside one event loop a decision is atomic.
"""

from __future__ import annotations

import sys
import time
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
from gateway.logs import error as errorlog
from gateway.store.base import AlgoUse, LimitSet, Verdict

# Bytes one key costs beyond its own length: OrderedDict slot and list node, the key
# object and the packed int: 164 bytes at 1M keys, 189 just after the table doubles
# (CPython 3.11, 64-bit; scripts/bench_memory.py). The worst case keeps `size` a bound.
ENTRY_COST = 192

# Held keys a full zone looks at per new key (a bounded step: a zone full of live state
# costs each refused key this many checks, never a scan).
HELD_SCAN = 4
ZONE_FULL_RETRY_MS = 1000  # Retry-After of a new key refused by a full zone (nginx's 503 says nothing)

# A limit_req state is held while it has excess or a ban (nginx_req.pack's layout).
_REQ_HELD_MASK = nginx_req.EXCESS_MASK
_REQ_BAN_SHIFT = nginx_req.BAN_SHIFT


class _LruZone:
    """States by key in two classes (module docstring), charged ENTRY_COST + len(key) against ``size``.

    ``nodes``: free keys, least recently used first. ``held``: held keys, in the order a
    full zone looks at them.
    """

    kind: str

    def __init__(self, spec: ZoneSpec) -> None:
        self.nodes: OrderedDict[bytes, Any] = OrderedDict()
        self.held: OrderedDict[bytes, Any] = OrderedDict()
        self.used = 0
        self.refused = 0  # new keys refused because the zone was full of held keys
        self._removals = 0
        self._told = 0.0  # when the error log last said so
        self.reconfigure(spec)

    def reconfigure(self, spec: ZoneSpec) -> None:
        self.spec = spec
        self.size = spec.size
        while self.used > self.size and (self.nodes or self.held):
            self._drop_lru()  # a smaller zone (a reload): free keys first, then held ones

    def get(self, key: bytes) -> Any:
        state = self.nodes.get(key)
        if state is not None:
            self.nodes.move_to_end(key)
            return state
        return self.held.get(key)

    def lookup(self, key: bytes) -> Any:
        """The key's state without touching its place (None: no state)."""
        state = self.nodes.get(key)
        return self.held.get(key) if state is None else state

    def __contains__(self, key: bytes) -> bool:
        return key in self.nodes or key in self.held

    def key_cost(self, key: bytes) -> int:
        return ENTRY_COST + len(key)

    def lapsed(self, state: Any, now: int) -> bool:
        """Whether a held state is worth nothing any more (dropping it changes no answer that matters)."""
        raise NotImplementedError

    def _drop(self, key: bytes) -> None:
        if self.nodes.pop(key, None) is None:
            del self.held[key]
        self.used -= self.key_cost(key)
        self._removed()

    def _removed(self) -> None:
        """A key left one of the dicts. A dict keeps the table of its largest size, so when keys
        move from one class to the other both tables could be sized for the whole zone: now and
        then, one that is mostly empty is copied into a table of its size (amortised O(1)), so
        ``ENTRY_COST`` per key stays a bound."""
        self._removals += 1
        if self._removals & 255:
            return
        if sys.getsizeof(self.nodes) > 256 * len(self.nodes) + 16384:
            self.nodes = OrderedDict(self.nodes)
        if sys.getsizeof(self.held) > 256 * len(self.held) + 16384:
            self.held = OrderedDict(self.held)

    def _drop_lru(self) -> None:
        self._drop(next(iter(self.nodes if self.nodes else self.held)))

    def make_room(self, cost: int, now: int) -> bool:
        """Evict free keys, least recently used first, then drop lapsed held ones, until ``cost``
        more bytes fit; False (and nothing held dropped that still counts) when they cannot."""
        # (self.nodes and self.held are looked up each time: a drop may copy them, _removed)
        while self.used + cost > self.size and self.nodes:
            self._drop(next(iter(self.nodes)))
        if self.used + cost <= self.size:
            return True
        for _ in range(min(HELD_SCAN, len(self.held))):
            key, state = next(iter(self.held.items()))
            if self.lapsed(state, now):
                self._drop(key)
                if self.used + cost <= self.size:
                    return True
            else:
                self.held.move_to_end(key)  # the next new key looks at the next ones
        self.refused += 1
        return False

    def _tell_refused(self) -> None:
        """Say in the error log, at most once a second, that the zone refuses new keys."""
        wall = time.monotonic()
        if wall - self._told >= 1.0:
            self._told = wall
            errorlog.log.error(
                'zone "%s" is full of limited or banned keys: could not allocate node for a new key '
                "(%d refused so far); a larger size holds more",
                self.spec.name,
                self.refused,
            )

    def __len__(self) -> int:
        return len(self.nodes) + len(self.held)


class ReqZone(_LruZone):
    """A limit_req zone: implements ``nginx_req.ReqTable``."""

    kind = "req"

    def reconfigure(self, spec: ZoneSpec) -> None:
        assert spec.rate is not None
        self.rate_m = spec.rate.rate_m
        super().reconfigure(spec)

    def peek(self, key: bytes) -> int | None:
        state = self.nodes.get(key)
        return self.held.get(key) if state is None else state

    def put(self, key: bytes, state: int) -> None:
        """Store a state; excess or a ban makes the key held (a held key stays held until it lapses)."""
        nodes = self.nodes
        if key in nodes:
            if state & _REQ_HELD_MASK or state >> _REQ_BAN_SHIFT:
                del nodes[key]
                self.held[key] = state
                self._removed()
            else:
                nodes[key] = state
        elif key in self.held:
            self.held[key] = state
        else:  # (evicted since this request looked it up: one route, two limits on this zone)
            self.used += self.key_cost(key)
            self.held[key] = state

    def hold(self, key: bytes) -> None:
        """The key is at its limit (its next request would be refused): it is held from now on."""
        if key in self.held:
            return
        state = self.nodes.pop(key, None)
        if state is not None:
            self.held[key] = state
            self._removed()

    def delete(self, key: bytes) -> None:
        if key in self.nodes or key in self.held:
            self._drop(key)

    def insert(self, key: bytes, state: int, now: int) -> bool:
        cost = ENTRY_COST + len(key)
        if cost > self.size:
            return False
        self._expire(now)
        if self.used + cost > self.size and not self.make_room(cost, now):
            return False
        self.used += cost
        if state & _REQ_HELD_MASK or state >> _REQ_BAN_SHIFT:
            self.held[key] = state
        else:
            self.nodes[key] = state
        return True

    def _expire(self, now: int) -> None:
        """nginx's step before each new key: drop up to two idle, drained keys at the LRU end."""
        for _ in range(2):
            if not self.nodes:
                return
            key, state = next(iter(self.nodes.items()))
            if not nginx_req.expirable(state, now, self.rate_m):
                return
            self._drop(key)

    def lapsed(self, state: int, now: int) -> bool:
        """Banned: until the ban ends. Otherwise until a request would fare as a new key's does
        (excess 0 after it): one period after the bucket drained, as nginx charges a new key's
        first request nothing."""
        excess, last, ban_until = nginx_req.unpack(state)
        if ban_until:
            return ban_until <= now
        return excess - self.rate_m * abs(now - last) // 1000 + 1000 <= 0


class CountZone(_LruZone):
    """A limit_count zone: every stored window is held until it ends."""

    kind = "count"

    def expired(self, state: Any, now: int) -> bool:
        if self.spec.window_type == "sliding":
            return sliding_count.expired(state, now, self.spec.window_ms)
        return count_logic.expired(state, now)

    def lapsed(self, state: Any, now: int) -> bool:
        return self.expired(state, now)

    def room_for(self, key: bytes, now: int) -> bool:
        """Whether ``key`` has or can get a place (made now, for the ``store`` that follows)."""
        if key in self.held or key in self.nodes:
            return True
        cost = self.key_cost(key)
        if cost > self.size:
            return False
        if self.used + cost <= self.size or self.make_room(cost, now):
            return True
        self._tell_refused()  # (limit_req's refusals are logged per request, as nginx's are)
        return False

    def store(self, key: bytes, state: Any, now: int) -> None:
        if key in self.held:
            self.held[key] = state
            return
        if self.nodes.pop(key, None) is not None:
            self.used -= self.key_cost(key)
        for _ in range(2):  # like nginx, look at the oldest twice: drop ended state
            if not self.held:
                break
            old_key, old_state = next(iter(self.held.items()))
            if not self.lapsed(old_state, now):
                break
            self._drop(old_key)
        cost = self.key_cost(key)
        if self.used + cost > self.size and not self.make_room(cost, now):
            # Only when one route uses this zone twice and the first key took the last room:
            # that request goes uncounted here rather than evicting someone's window.
            return
        self.held[key] = state
        self.used += cost


class AlgoZone(CountZone):
    """A zone of the newer algorithms: its type's state per key (``gateway.limits.registry``).

    A key is charged its type's ``extra_bytes`` beyond the fixed cost (a sliding_log pays for a
    full log up front), so ``size`` stays a bound whatever the states hold. Every state is held
    until its type says it is the same as none (``expired``).
    """

    def __init__(self, spec: ZoneSpec) -> None:
        self.extra = 0
        super().__init__(spec)

    def reconfigure(self, spec: ZoneSpec) -> None:
        self.kind = spec.type
        self.algo: AlgoType = algo_type(spec.type)
        self.params = self.algo.params_of(spec)
        extra = self.algo.extra_bytes(self.params)
        if (self.nodes or self.held) and extra != self.extra:
            self.nodes.clear()  # the charge per key changes: start over rather than miscount
            self.held.clear()
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
            if req.rc >= nginx_req.BUSY:
                if req.rc == nginx_req.BUSY:
                    req_tables[req.index].hold(req_keys[req.index])  # limited: not evictable for others
                if not dry:
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
                table = count_tables[i]
                state = table.get(key)
                step = _count_step(state, now, limit)
                if state is None and step.allowed and not table.room_for(key, now):
                    # the zone is full of live windows: refused, as a new key nginx cannot place
                    step = count_logic.CountStep(False, limit.limit, ZONE_FULL_RETRY_MS, step.state)
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
            # A key whose next request would be refused is limited: held, not evictable by a flood
            # of other keys (a one-shot key under a burst stays free, and floods evict those).
            limits = route.limit_req
            if len(limits) == 1:  # (the usual route: its excess is the decision's)
                if req.excess + 1000 > limits[0].burst_m:
                    req_tables[0].hold(req_keys[0])
            else:
                for i, excess in enumerate(req.excesses):
                    if excess is not None and excess + 1000 > limits[i].burst_m:
                        req_tables[i].hold(req_keys[i])
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
            table = tables[i]
            old = table.get(key)
            outcome, state = limit.algo.decide(limit.params, old, now, cost)
            if old is None and state is not None and not table.room_for(key, now):
                # the zone is full of held keys: refused, as a new key nginx cannot place
                outcome = AlgoOutcome(False, outcome.limit, 0, ZONE_FULL_RETRY_MS // 1000, outcome.reset_s)
                state = None
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
