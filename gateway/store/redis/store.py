"""Limit state in Redis, shared by every gateway node (and by OpenResty nodes).

* ``request.lua`` evaluates one request's limit_req, limit_count and limit_conn
  zones atomically; the batcher (``batcher.py``) runs the requests of one tick,
  and those asked while the previous call is on the wire, in one ``batch.lua``
  call: one write, one script call, one deadline for many requests. Releases and
  lease renewals ride in those batches. On Redis Cluster, keys are grouped by slot
  and batched per slot, the groups in parallel (one round trip of latency); limit_req
  keys stay ``<prefix><zone>:<key>`` for OpenResty, count and conn keys carry a hash
  tag so all of one client's count and conn keys share a slot. If one group
  rejects while another committed, the committed part is undone (``undo.lua``).
* Time is this node's clock (epoch ms), passed to the scripts as OpenResty does.
* Bans: a FORBIDDEN reply, or a BUSY reply that starts a ban, is remembered in
  this process until the ban ends, so a banned client's flood costs no Redis calls.
* limit_conn slots are leases (sorted sets scored by lease end, ``leases.py``); live
  requests have their leases renewed, so a node that dies leaks its slots for one
  lease at most. Topology and client library are hidden behind ``client.py``;
  ``reply.py`` decodes request.lua's reply into named fields.
* Failures: every batch is bounded by ``timeout`` from its first request. Two failed
  calls in a row open the circuit breaker (``breaker.py``, which also counts calls by
  outcome for metrics): calls then fail at once, and a probe PINGs every 100 ms and
  closes it when Redis answers. While Redis is unusable, ``on_error`` decides:
  ``local`` uses this node's embedded store, ``allow`` lets requests through,
  ``deny`` rejects them with 503 (the last two through ``StoreUnavailable``).
* Scripts are loaded at start and again after NOSCRIPT (a restarted Redis).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from gateway.background import spawn
from gateway.clock import epoch_ms
from gateway.config.store import RedisSpec
from gateway.config.zones import ZoneSpec
from gateway.errors import StoreUnavailable
from gateway.limits import conn as limit_conn
from gateway.limits import nginx_req
from gateway.limits.conn import ConnDecision
from gateway.logs import error as errorlog
from gateway.metrics.stats import STATS
from gateway.store import lua
from gateway.store.base import AlgoUse, LimitSet, Verdict
from gateway.store.memory import MemoryStore
from gateway.store.redis.batcher import Batcher
from gateway.store.redis.breaker import Breaker
from gateway.store.redis.client import CALL_ERRORS, NO_SCRIPT, ScriptClient, connect, script_client, slot_tags
from gateway.store.redis.leases import Leases
from gateway.store.redis.reply import FullCall, Item, ReplyLayout, RequestReply, algo_params
from gateway.store.resp import encode_args

LEASE_MS = 30_000
RENEW_EVERY_S = 10.0
LOCAL_BANS_MAX = 100_000

_Shape = tuple[list[Any], bytes, ReplyLayout]  # a call shape's fixed arguments (list, encoded) and reply layout


class RedisStore:
    kind = "redis"

    def __init__(self, spec: RedisSpec, clock_ms: Callable[[], int] = epoch_ms) -> None:
        lua.require_all()  # ScriptsMissing: refuse to start rather than report a Redis outage later
        self.spec = spec
        self.clock_ms = clock_ms
        self.prefix = spec.prefix.encode()
        self.timeout = spec.timeout_ms / 1000
        self.on_error = spec.on_error
        self.fallback = MemoryStore() if spec.on_error == "local" else None
        self.cluster = bool(spec.cluster)
        self.client: ScriptClient = script_client(spec, self.timeout)
        self.breaker = Breaker(spec.on_error)
        self.breaker.probe_with(self._ping)
        self.breaker.observers.append(_count_call)
        self.batcher = Batcher(self.client, self.breaker, self.timeout, self._load_scripts)
        self.leases = Leases(self.batcher, self.client.slot, clock_ms)
        self.local_bans: dict[tuple[str, bytes], int] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self._tags: list[bytes] | None = None
        self.zones: dict[str, ZoneSpec] = {}
        self._pending_undo: list[Coroutine[Any, Any, None]] = []  # cluster: undo calls of this decision
        self._static: dict[tuple[Any, ...], tuple[LimitSet, _Shape]] = {}
        self._zone_heads: dict[str, bytes] = {}  # zone -> b"<prefix><zone>:"
        self._full: dict[int, FullCall] = {}  # id(route) -> its call when every limit has a key
        # Calls of a route whose every limit has a key take the short path (FullCall). False:
        # every call takes the general one; the conformance suite runs the vectors both ways.
        self.full_calls = True

    # -- lifecycle ---------------------------------------------------------------------------------
    def configure(self, zones: Any) -> None:
        self.zones = dict(zones)
        if self.fallback is not None:
            self.fallback.configure(zones)

    def subscriber(self) -> Any:
        """A client for SUBSCRIBE (no read timeout: a subscription is mostly silence)."""
        return connect(self.spec, None)

    async def start(self) -> None:
        if self.cluster:
            self._tags = await asyncio.get_running_loop().run_in_executor(None, slot_tags)
        try:
            async with asyncio.timeout(self.timeout * 4):
                await self._load_scripts()
        except CALL_ERRORS as exc:
            errorlog.log.error("Redis is not available at start (%r); on_error=%s applies", exc, self.on_error)
            self.breaker.trip()
        self._tasks.append(spawn(self.leases.renew_every(lambda: RENEW_EVERY_S, lambda: LEASE_MS)))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        self.breaker.close()
        self.batcher.flush_all()  # the releases queued last go out before the connection closes
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.batcher.idle(), self.timeout)
        self.batcher.close()
        with contextlib.suppress(Exception):
            await self.client.close()

    def status(self) -> dict[str, Any]:
        return {
            "redis_circuit": self.breaker.state,
            "redis_calls": dict(self.breaker.calls),
            "redis_circuit_openings": self.breaker.openings,
        }

    def deliver_bans(self, sink: Any) -> bool:
        return False  # bans come from Redis itself (gateway/bans/redis.py)

    # -- calling Redis -----------------------------------------------------------------------------
    async def _load_scripts(self) -> None:
        for name in lua.SCRIPTS:
            await self.client.load(lua.source(name))

    async def _ping(self) -> None:
        await asyncio.wait_for(self.client.ping(), self.timeout)
        await asyncio.wait_for(self._load_scripts(), self.timeout * 4)

    async def _eval(self, name: str, keys: Sequence[bytes], args: Sequence[Any]) -> Any:
        """One script call outside the batches (undo.lua on a cluster), NOSCRIPT recovery included."""
        if self.breaker.open:
            raise StoreUnavailable("Redis circuit is open")
        sha = lua.sha1(name)
        encoded = encode_args(list(args))
        try:
            async with asyncio.timeout(self.timeout):
                try:
                    return await self.client.evalsha(sha, keys, args, encoded, len(args))
                except NO_SCRIPT:
                    await self._load_scripts()
                    return await self.client.evalsha(sha, keys, args, encoded, len(args))
        except CALL_ERRORS as exc:
            raise StoreUnavailable(f"Redis unavailable: {exc!r}") from exc

    # -- keys --------------------------------------------------------------------------------------
    def _req_key(self, zone: str, key: bytes) -> bytes:
        head = self._zone_heads.get(zone)
        if head is None:
            head = self._zone_heads[zone] = self.prefix + zone.encode() + b":"
        return head + key

    def _tagged_key(self, zone: str, key: bytes) -> bytes:
        if self._tags is None:
            return self._req_key(zone, key)
        from redis.crc import key_slot

        return self.prefix + self._tags[key_slot(key)] + zone.encode() + b":" + key

    # -- the store interface -----------------------------------------------------------------------
    async def admit(
        self,
        route: LimitSet,
        req_keys: Sequence[bytes],
        count_keys: Sequence[bytes],
        conn_keys: Sequence[bytes],
        algo: Sequence[AlgoUse] = (),
    ) -> Verdict:
        now = self.clock_ms()
        if not route.dry_run:
            banned = self._locally_banned(route, req_keys, now)
            if banned is not None:
                return banned
            if self.full_calls and not self.cluster and not route.limit_algo:
                # The short path, inline (each coroutine level costs on every resume).
                call = self._full.get(id(route))
                if call is None or call.route is not route:
                    call = self._full_call(route)
                raw = [*req_keys, *count_keys, *conn_keys]
                keys = call.keys(raw)
                if keys is not None:
                    # A lease member names this request's limit_conn slots: none to name without them.
                    member = self.leases.next_member() if call.n_conn else b""
                    try:
                        pending = self.batcher.request(0, keys, (now, member, ""), call.tail, call.tail_bytes)
                    except StoreUnavailable:  # the circuit is open: nothing was sent, nothing is held
                        if self.fallback is None:
                            raise
                        return self.fallback.decide(route, req_keys, count_keys, conn_keys, algo)
                    try:
                        reply = await pending
                    except BaseException as exc:
                        # Cancelled or failed after the script may have run: give back its slots.
                        self._release_abandoned(member, keys[call.conn_from :])
                        if isinstance(exc, StoreUnavailable) and self.fallback is not None:
                            return self.fallback.decide(route, req_keys, count_keys, conn_keys, algo)
                        raise
                    verdict = call.passed(reply, now, member, keys)
                    if verdict is None:
                        return await self._settle(call, reply, keys, raw, now, member)
                    if verdict.conn is not None:
                        self.leases.hold(member, keys[call.conn_from :])
                    return verdict
        try:
            return await self._admit(route, req_keys, count_keys, conn_keys, now, take_conn=True, algo=algo)
        except StoreUnavailable:
            if self.fallback is None:
                raise
            return self.fallback.decide(route, req_keys, count_keys, conn_keys, algo)

    async def acquire_conn(self, route: LimitSet, conn_keys: Sequence[bytes]) -> ConnDecision:
        now = self.clock_ms()
        try:
            verdict = await self._admit(route, (), (), conn_keys, now, take_conn=True, conn_only=True)
        except StoreUnavailable:
            if self.fallback is None:
                raise
            return self.fallback.take_conn(route, conn_keys)
        assert verdict.conn is not None
        return verdict.conn

    def release(self, route: LimitSet, decision: ConnDecision) -> None:
        if decision.taken and not isinstance(decision.taken[0][0], bytes):
            # slots of the embedded fallback (taken while Redis was unavailable): (zone, key)
            if self.fallback is not None:
                self.fallback.release(route, decision)
        elif decision.taken:
            member = decision.taken[0][1]  # Redis leases: (key, member), one member per request
            self.leases.release(member, [key for key, _ in decision.taken])
        decision.taken = []

    # -- one request -------------------------------------------------------------------------------
    def _locally_banned(self, route: LimitSet, req_keys: Sequence[bytes], now: int) -> Verdict | None:
        if not self.local_bans:
            return None
        for i, limit in enumerate(route.limit_req):
            key = req_keys[i] if i < len(req_keys) else b""
            if not key or not limit.ban_ms:
                continue
            until = self.local_bans.get((limit.zone, key))
            if until is None:
                continue
            if until <= now:
                del self.local_bans[(limit.zone, key)]
                continue
            excesses: list[int | None] = [None] * len(route.limit_req)
            return Verdict(
                now_ms=now, req=nginx_req.ReqDecision(nginx_req.FORBIDDEN, i, 0, 0, excesses, ban_until=until)
            )
        return None

    def _remember_ban(self, zone: str, key: bytes, until: int) -> None:
        if len(self.local_bans) >= LOCAL_BANS_MAX:
            now = self.clock_ms()
            for k in [k for k, v in self.local_bans.items() if v <= now]:
                del self.local_bans[k]
            if len(self.local_bans) >= LOCAL_BANS_MAX:
                self.local_bans.pop(next(iter(self.local_bans)))
        self.local_bans[(zone, key)] = until

    async def _admit(
        self,
        route: LimitSet,
        req_keys: Sequence[bytes],
        count_keys: Sequence[bytes],
        conn_keys: Sequence[bytes],
        now: int,
        *,
        take_conn: bool,
        conn_only: bool = False,
        algo: Sequence[AlgoUse] = (),
    ) -> Verdict:
        items: list[Item] = []  # the limits that apply (their key is not empty)
        if not conn_only:
            for i, (lim, k) in enumerate(zip(route.limit_req, req_keys, strict=True)):
                if k and len(k) <= nginx_req.MAX_KEY:
                    items.append(("r", i, self._req_key(lim.zone, k), k))
            for i, (lim, k) in enumerate(zip(route.limit_count, count_keys, strict=True)):
                if k:
                    items.append(("c", i, self._tagged_key(lim.zone, k), k))
        for i, (lim, k) in enumerate(zip(route.limit_conn, conn_keys, strict=True)):
            if k and len(k) <= limit_conn.MAX_KEY:
                items.append(("n", i, self._tagged_key(lim.zone, k), k))
        costs: list[int] = []
        if not conn_only:
            for i, (lim, (k, cost)) in enumerate(zip(route.limit_algo, algo, strict=True)):
                kind = lim.algo  # the zone type's record, bound by the plan
                costs.append(kind.clamp(lim.params, cost))
                if not k:
                    continue
                # an untagged type's keys are like limit_req's (gcra: the key CL.THROTTLE would use)
                key = self._tagged_key(lim.zone, k) if kind.tagged else self._req_key(lim.zone, k)
                items.append(("g", i, key, k))
        verdict = _blank_verdict(route, now, conn_only)
        wants_conn = bool(route.limit_conn) and take_conn
        if not items:
            if wants_conn:
                verdict.conn = ConnDecision(-1, False, [None] * len(route.limit_conn), [])
            return verdict
        member = self.leases.next_member()
        if self.cluster:
            groups: dict[int, list[Item]] = {}
            for item in items:
                groups.setdefault(self.client.slot(item[2]), []).append(item)
            parts = list(groups.values())
        else:
            parts = [items]
        # Every limit of the call's kinds has its key, in one call: the shape is the route's own.
        limits = len(route.limit_conn)
        if not conn_only:
            limits += len(route.limit_req) + len(route.limit_count) + len(route.limit_algo)
        full = not self.cluster and len(items) == limits
        try:
            if len(parts) == 1:
                results = [await self._call_request(route, parts[0], now, wants_conn, member, costs, full=full)]
                failed: list[BaseException] = []
            else:
                calls = (self._call_request(route, part, now, wants_conn, member, costs) for part in parts)
                replies = await asyncio.gather(*calls, return_exceptions=True)
                results = [r for r in replies if not isinstance(r, BaseException)]
                failed = [r for r in replies if isinstance(r, BaseException)]
        except BaseException:
            # Cancelled (the client left) or failed after the script may have run: a slot
            # it took would be held by nobody. Give back whatever this request may hold.
            self._release_abandoned(member, [item[2] for item in items if item[0] == "n"] if wants_conn else [])
            raise
        if failed:
            # Some groups answered, some did not: take back what the answering ones charged.
            for result in results:
                self._undo(result, member, req=True, count=True, conn=True)
            self._release_abandoned(member, [item[2] for item in items if item[0] == "n"] if wants_conn else [])
            await self._run_undo()
            raise failed[0] if isinstance(failed[0], StoreUnavailable) else StoreUnavailable(repr(failed[0]))
        verdict = self._merge(route, verdict, results, wants_conn, member, now)
        if self._pending_undo:
            # Before the answer goes out, the other slot groups' charges are taken back.
            await self._run_undo()
        return verdict

    async def _settle(
        self, call: FullCall, reply: list[Any], keys: list[bytes], raw: list[bytes], now: int, member: bytes
    ) -> Verdict:
        """A short-path reply that did not pass everywhere (a refusal, a ban, a delay): decided
        by ``_merge``, as the general path decides it."""
        route = call.route
        result = RequestReply(call.layout, call.items(keys, raw), reply, [], route, now)
        verdict = self._merge(route, _blank_verdict(route, now, False), [result], bool(route.limit_conn), member, now)
        if self._pending_undo:
            await self._run_undo()
        return verdict

    def _full_call(self, route: LimitSet) -> FullCall:
        n_req, n_count = len(route.limit_req), len(route.limit_count)
        zones = [lim.zone for lim in (*route.limit_req, *route.limit_count, *route.limit_conn)]
        heads = [self._req_key(zone, b"") for zone in zones]
        kinds = [("r", i) for i in range(n_req)] + [("c", i) for i in range(n_count)]
        kinds += [("n", i) for i in range(len(route.limit_conn))]
        part: list[Item] = [(kd, i, b"", b"") for kd, i in kinds]
        wants_conn = bool(route.limit_conn)
        tail, tail_bytes, layout = self._shape((id(route), wants_conn, len(part)), route, part, wants_conn)
        if len(self._full) > 10_000:
            self._full.clear()
        call = self._full[id(route)] = FullCall(route, kinds, heads, tail, tail_bytes, layout)
        return call

    async def _run_undo(self) -> None:
        """Await the undo calls for up to one ``timeout``; past that they finish in the background."""
        calls, self._pending_undo = self._pending_undo, []
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(asyncio.gather(*calls)), self.timeout)

    def _release_abandoned(self, member: bytes, keys: list[bytes]) -> None:
        if not keys:
            return
        if not self.cluster:
            # One connection, batches in order: the release cannot overtake the script call.
            self.leases.release(member, keys)
            return
        # Other connections could run the release first; wait until the call is surely done.
        self.leases.release_later(member, keys, max(1.0, self.timeout * 4))

    async def _call_request(
        self,
        route: LimitSet,
        part: list[Item],
        now: int,
        take_conn: bool,
        member: bytes,
        costs: list[int],
        *,
        full: bool = False,
    ) -> RequestReply:
        """One group's request.lua call, through the batcher. ``full``: the part holds every
        limit of the route (of its kinds), so its shape is known without spelling it out."""
        signature = (id(route), take_conn, len(part)) if full else (id(route), take_conn, *[i[:2] for i in part])
        cached = self._static.get(signature)
        if cached is not None and cached[0] is route:
            tail, tail_bytes, layout = cached[1]
        else:
            tail, tail_bytes, layout = self._shape(signature, route, part, take_conn)
        keys = [item[2] for item in part]  # built in the script's order: r, c, n, g
        part_costs = ",".join(str(costs[i]) for i in layout.algo) if layout.algo else ""
        group = self.client.slot(keys[0]) if self.cluster else 0
        reply = await self.batcher.request(group, keys, (now, member, part_costs), tail, tail_bytes)
        return RequestReply(layout, part, reply, costs, route, now)

    def _shape(self, signature: tuple[Any, ...], route: LimitSet, part: list[Item], take_conn: bool) -> _Shape:
        """What a request.lua call of this shape carries that depends only on the route, and where
        its reply puts each limit: computed once per shape."""
        kinds = [(kd, i) for kd, i, _, _ in part]
        if kinds != sorted(kinds, key=lambda item: "rcng".index(item[0])):
            raise AssertionError(f"request.lua's keys go in the order r, c, n, g: {kinds}")
        layout = ReplyLayout(kinds, route)
        reqs, counts, conns, algos = layout.req, layout.count, layout.conn, layout.algo
        tail: list[Any] = [1 if route.dry_run else 0, len(reqs), len(counts), len(conns)]
        tail += [1 if take_conn else 0, LEASE_MS, len(algos)]
        for i in reqs:
            lim = route.limit_req[i]
            tail += [lim.rate_m, lim.burst_m, min(lim.delay_m, 2**53), lim.ban_ms // 1000]
        for i in counts:
            lim = route.limit_count[i]
            tail += [lim.limit, lim.window_ms, 1 if lim.sliding else 0]
        for i in algos:
            tail += algo_params(route.limit_algo[i])
        for i in conns:
            tail.append(route.limit_conn[i].max)
        value = (tail, encode_args(tail), layout)
        if len(self._static) > 10_000:
            self._static.clear()
        self._static[signature] = (route, value)
        return value

    def _merge(
        self, route: LimitSet, verdict: Verdict, results: list[RequestReply], wants_conn: bool, member: bytes, now: int
    ) -> Verdict:
        dry = route.dry_run
        req_fail: tuple[int, RequestReply] | None = None
        delay_ms, delay_index = 0, -1
        count_fail = -1
        algo_fail = -1
        conn_fail = -1
        conn_counts: list[int | None] = [None] * len(route.limit_conn)
        taken: list[tuple[Any, bytes]] = []
        conn_everywhere = True
        for result in results:
            if verdict.req is not None:
                for i, excess in result.excesses():
                    verdict.req.excesses[i] = excess
            if result.rc != 1:
                index, key = result.req_items[result.fail_index - 1]
                if req_fail is None or index < req_fail[0]:
                    req_fail = (index, result)
                if result.ban_ms > 0:
                    self._remember_ban(route.limit_req[index].zone, key, now + result.ban_ms)
            elif result.delay_index > 0:
                index = result.layout.req[result.delay_index - 1]
                if (
                    delay_index < 0
                    or result.delay_ms > delay_ms
                    or (result.delay_ms == delay_ms and index > delay_index)
                ):
                    delay_ms, delay_index = result.delay_ms, index
            for i, used, reset in result.counts():
                verdict.count_used[i] = used
                verdict.count_reset_ms[i] = reset
            if result.count_fail > 0:
                index = result.layout.count[result.count_fail - 1]
                count_fail = index if count_fail < 0 else min(count_fail, index)
            if result.layout.algo:
                for i, outcome in result.algo_outcomes():
                    verdict.algo[i] = outcome
            if result.algo_fail > 0:
                index = result.layout.algo[result.algo_fail - 1]
                algo_fail = index if algo_fail < 0 else min(algo_fail, index)
            if result.layout.conn:
                if not result.conn_done:
                    conn_everywhere = False
                    continue
                for i, count in result.conn_counts():
                    conn_counts[i] = count
                if result.conn_fail > 0:
                    index = result.layout.conn[result.conn_fail - 1]
                    conn_fail = index if conn_fail < 0 else min(conn_fail, index)
                else:
                    taken += [(key, member) for key in result.conn_keys]
        if verdict.req is not None and any(r.layout.req for r in results):
            if req_fail is not None:
                index, result = req_fail
                verdict.req.rc = nginx_req.BUSY if result.rc == 2 else nginx_req.FORBIDDEN
                verdict.req.index = index
                verdict.req.excess = result.fail_excess
                verdict.req.new_ban = result.rc == 2 and result.ban_ms > 0
                verdict.req.ban_until = now + result.ban_ms if result.ban_ms > 0 else 0
            else:
                verdict.req.rc = nginx_req.OK
                verdict.req.delay_ms = delay_ms
                verdict.req.index = delay_index
                verdict.req.excess = verdict.req.excesses[delay_index] or 0 if delay_index >= 0 else 0
        verdict.count_rejected = count_fail
        verdict.algo_rejected = algo_fail if count_fail < 0 or dry else -1
        rejected = (req_fail is not None or count_fail >= 0 or algo_fail >= 0) and not dry
        delayed = (delay_ms > 0 or any(a is not None and a.delay_ms > 0 for a in verdict.algo)) and not dry
        if len(results) > 1 and rejected:
            # Cluster: another slot group rejected what this one charged.
            for result in results:
                self._undo(result, member, req=True, count=True, conn=False)
        if not wants_conn:
            return verdict
        if rejected or delayed or not conn_everywhere or conn_fail >= 0:
            # No slot is held: rejected requests never hold one, delayed ones take it after the wait,
            # and a rejection by one conn zone gives back the slots taken in the others.
            if taken:
                for result in results:
                    self._undo(result, member, req=False, count=False, conn=True)
            if conn_fail >= 0 and not rejected and not delayed:
                conn_counts[conn_fail] = route.limit_conn[conn_fail].max
                verdict.conn = ConnDecision(conn_fail, False, conn_counts, [])
            return verdict
        verdict.conn = ConnDecision(-1, False, conn_counts, taken)
        if taken:
            self.leases.hold(member, [key for key, _ in taken])
        return verdict

    def _undo(self, result: RequestReply, member: bytes, *, req: bool, count: bool, conn: bool) -> None:
        keys: list[bytes] = []
        kinds: list[str] = []
        committed = result.rc == 1 and result.count_fail == 0 and result.algo_fail == 0
        if committed and count:
            for key, kind in result.algo_undo:
                keys.append(key)
                kinds.append(kind)
        if committed and req:
            req_keys = result.req_keys_redis
            keys += req_keys
            kinds += ["r"] * len(req_keys)
        if committed and count:
            count_keys = result.count_keys
            keys += count_keys
            kinds += ["c"] * len(count_keys)
        if conn and result.conn_done and result.conn_fail == 0:
            conn_keys = result.conn_keys
            keys += conn_keys
            kinds += ["n"] * len(conn_keys)
        if keys:
            self._pending_undo.append(self._undo_call(keys, kinds, member))

    async def _undo_call(self, keys: list[bytes], kinds: list[str], member: bytes) -> None:
        try:
            await self._eval("undo.lua", keys, [member, *kinds])
        except StoreUnavailable as exc:
            errorlog.log.warning("could not undo a partial decision in Redis: %s", exc)


def _blank_verdict(route: LimitSet, now: int, conn_only: bool) -> Verdict:
    """A verdict before any reply: every limit of the call's kinds not (yet) applied."""
    verdict = Verdict(now_ms=now)
    if not conn_only and route.limit_req:
        verdict.req = nginx_req.ReqDecision(nginx_req.DECLINED, -1, 0, 0, [None] * len(route.limit_req))
    if not conn_only and route.limit_count:
        verdict.count_used = [None] * len(route.limit_count)
        verdict.count_reset_ms = [None] * len(route.limit_count)
    if not conn_only and route.limit_algo:
        verdict.algo = [None] * len(route.limit_algo)
    return verdict


def _count_call(outcome: str, seconds: float) -> None:
    """gateway_redis_calls_total{outcome} and the call-duration histogram: a batch is one call;
    a refused connection counts as an error."""
    STATS.redis_call("error" if outcome == "unavailable" else outcome, seconds)
