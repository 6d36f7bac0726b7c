"""Limit state in Redis, shared by every gateway node (and by OpenResty nodes).

* One round trip per request: ``request.lua`` evaluates a route's limit_req,
  limit_count and limit_conn zones atomically. On Redis Cluster, keys are grouped
  by slot and the groups run in parallel (one round trip of latency); limit_req
  keys stay ``<prefix><zone>:<key>`` for OpenResty, count and conn keys carry a hash
  tag so all of one client's count and conn keys share a slot. If one group
  rejects while another committed, the committed part is undone (``undo.lua``).
* Time is this node's clock (epoch ms), passed to the scripts as OpenResty does.
* Bans: a FORBIDDEN reply, or a BUSY reply that starts a ban, is remembered in
  this process until the ban ends, so a banned client's flood costs no Redis calls.
* limit_conn slots are leases (sorted sets scored by lease end); live requests have
  their leases renewed, so a node that dies leaks its slots for one lease at most.
* Failures: every call is bounded by ``timeout``. Two failures in a row open a
  circuit breaker: calls then fail at once, and a probe PINGs every 100 ms and
  closes it when Redis answers. While Redis is unusable, ``on_error`` decides:
  ``local`` uses this node's embedded store, ``allow`` lets requests through,
  ``deny`` rejects them with 503 (the last two through ``StoreUnavailable``).
* Scripts are loaded at start and again after NOSCRIPT (a restarted Redis).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError

from gateway import errorlog
from gateway.background import spawn
from gateway.config.schema import RedisSpec, ZoneSpec
from gateway.errors import StoreUnavailable
from gateway.limits import nginx_req
from gateway.limits.conn import ConnDecision
from gateway.limits.outcome import AlgoOutcome
from gateway.store import lua
from gateway.store.base import AlgoUse, LimitSet, Verdict
from gateway.store.memory import MemoryStore
from gateway.store.resp import NoScript, RespClient, RespError, encode, encode_args

LEASE_MS = 30_000
RENEW_EVERY_S = 10.0
PROBE_EVERY_S = 0.1
FAILURES_TO_OPEN = 2
LOCAL_BANS_MAX = 100_000


def epoch_ms() -> int:
    return time.time_ns() // 1_000_000


def _slot_tags() -> list[bytes]:
    """For every cluster slot, a short hash tag that maps to it."""
    from redis.crc import key_slot

    tags: list[bytes | None] = [None] * 16384
    missing = 16384
    i = 0
    while missing:
        tag = format(i, "x").encode()
        slot = key_slot(b"{" + tag + b"}")
        if tags[slot] is None:
            tags[slot] = b"{" + tag + b"}"
            missing -= 1
        i += 1
    return tags  # type: ignore[return-value]


class _Lease:
    """Releases one conn slot in Redis (``ConnDecision.taken`` holds ``(_Lease, member)``)."""

    __slots__ = ("key", "store")

    def __init__(self, store: RedisStore, key: bytes) -> None:
        self.store = store
        self.key = key

    def release(self, member: bytes) -> None:
        self.store._queue_release(self.key, member)


class Breaker:
    def __init__(self) -> None:
        self.failures = 0
        self.open = False
        self.opened_at = 0.0

    def success(self) -> None:
        self.failures = 0

    def failure(self) -> bool:
        """Count a failure; True when this one opened the circuit."""
        self.failures += 1
        if not self.open and self.failures >= FAILURES_TO_OPEN:
            self.open = True
            self.opened_at = time.monotonic()
            return True
        return False


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
        self.client: Any = None
        self.cluster = bool(spec.cluster)
        self.breaker = Breaker()
        self.local_bans: dict[tuple[str, bytes], int] = {}
        self.leases: dict[bytes, list[bytes]] = {}
        self._member_prefix = f"{os.uname().nodename}:{os.getpid()}:{os.urandom(3).hex()}:".encode()
        self._member_seq = 0
        self._release_queue: list[tuple[bytes, bytes]] = []
        self._release_scheduled = False
        self._tasks: list[asyncio.Task[Any]] = []
        self._probe: asyncio.Task[Any] | None = None
        self._tags: list[bytes] | None = None
        self.zones: dict[str, ZoneSpec] = {}
        # The request path's own pipelined connection (standalone Redis); redis-py otherwise.
        self.fast = RespClient(spec.url, self.timeout) if spec.url and not spec.cluster and not spec.sentinel else None
        self._pending_undo: list[Coroutine[Any, Any, None]] = []  # cluster: undo calls of this decision
        self._background: Any = None
        self._static: dict[tuple[Any, ...], tuple[LimitSet, tuple[list[int], list[Any], bytes]]] = {}

    # -- lifecycle ---------------------------------------------------------------------------------
    def configure(self, zones: Any) -> None:
        self.zones = dict(zones)
        if self.fallback is not None:
            self.fallback.configure(zones)

    def subscriber(self) -> Any:
        """A client for SUBSCRIBE (no read timeout: a subscription is mostly silence)."""
        return connect(self.spec, None)

    async def start(self) -> None:
        self.client = self._connect()
        if self.cluster:
            self._tags = await asyncio.get_running_loop().run_in_executor(None, _slot_tags)
        try:
            await self._guard(self._load_scripts())
        except StoreUnavailable as exc:
            errorlog.log.error("Redis is not available at start (%s); on_error=%s applies", exc, self.on_error)
            self._open_circuit()
        self._tasks.append(spawn(self._renew_leases()))

    def _connect(self) -> Any:
        return connect(self.spec, self.timeout)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._probe is not None:
            self._probe.cancel()
        self._flush_releases()
        await asyncio.sleep(0)
        if self.fast is not None:
            self.fast.close()
        for client in (self._background, self.client):
            if client is None:
                continue
            with contextlib.suppress(Exception):
                if self.cluster:
                    await client.aclose()
                else:
                    await client.aclose(close_connection_pool=True)

    # -- calling Redis -----------------------------------------------------------------------------
    async def _load_scripts(self) -> None:
        for name in ("request.lua", "undo.lua"):
            if self.fast is not None:
                await self.fast.call("SCRIPT", "LOAD", lua.source(name))
            else:
                await self.client.script_load(lua.source(name))

    async def _guard(self, call: Awaitable[Any]) -> Any:
        """Run one Redis call within the timeout; count its failure for the breaker."""
        try:
            async with asyncio.timeout(self.timeout):
                result = await call
        except (TimeoutError, RedisError, RespError, OSError) as exc:
            raise self._unavailable(exc) from exc
        self.breaker.success()
        return result

    def _unavailable(self, exc: BaseException) -> StoreUnavailable:
        """Turn a Redis failure into StoreUnavailable; count it for the breaker once."""
        no_script = isinstance(exc, (NoScriptError, NoScript))
        if isinstance(exc, (ResponseError, RespError)) and not no_script:
            return StoreUnavailable(f"Redis error: {exc}")
        # One dead connection fails every command queued on it: only the first counts.
        collateral = getattr(exc, "collateral", False)
        if not no_script and not collateral and self.breaker.failure():
            self._open_circuit()
        return StoreUnavailable(f"Redis unavailable: {exc!r}")

    def _open_circuit(self) -> None:
        self.breaker.open = True
        errorlog.log.error("Redis circuit open: calls fail fast, on_error=%s, probing every 100 ms", self.on_error)
        if self._probe is None or self._probe.done():
            self._probe = spawn(self._probe_loop())

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(PROBE_EVERY_S)
            try:
                ping = self.fast.call("PING") if self.fast is not None else self.client.ping()
                await asyncio.wait_for(ping, self.timeout)
                await asyncio.wait_for(self._load_scripts(), self.timeout * 4)
            except (TimeoutError, RedisError, RespError, OSError):
                continue
            self.breaker.open = False
            self.breaker.failures = 0
            errorlog.log.log(errorlog.NOTICE, "Redis answers again: circuit closed")
            return

    async def _eval(
        self, name: str, keys: Sequence[bytes], args: Sequence[Any], tail: Sequence[Any] = (), tail_bytes: bytes = b""
    ) -> Any:
        """One script call, NOSCRIPT recovery included, within one ``timeout``.

        ``tail`` are more arguments after ``args``; ``tail_bytes`` the same, already encoded.
        """
        if self.breaker.open:
            raise StoreUnavailable("Redis circuit is open")
        sha = lua.sha1(name)
        try:
            async with asyncio.timeout(self.timeout):
                try:
                    result = await self._evalsha(sha, keys, args, tail, tail_bytes)
                except (NoScriptError, NoScript):
                    # Redis restarted or failed over: its script cache is empty. Load, retry once.
                    errorlog.log.warning("Redis lost its scripts (NOSCRIPT): loading them again")
                    await self._load_scripts()
                    result = await self._evalsha(sha, keys, args, tail, tail_bytes)
        except (TimeoutError, RedisError, RespError, OSError) as exc:
            if isinstance(exc, TimeoutError) and self.fast is not None:
                self.fast.abort("Redis did not answer in time")
            raise self._unavailable(exc) from exc
        self.breaker.success()
        return result

    def _evalsha(
        self, sha: str, keys: Sequence[bytes], args: Sequence[Any], tail: Sequence[Any], tail_bytes: bytes
    ) -> Awaitable[Any]:
        if self.fast is not None:
            head = ("EVALSHA", sha, len(keys), *keys, *args)
            return self.fast.call_encoded(encode(head, tail_bytes, len(tail)))
        return self.client.evalsha(sha, len(keys), *keys, *args, *tail)  # type: ignore[no-any-return]

    # -- keys --------------------------------------------------------------------------------------
    def _req_key(self, zone: str, key: bytes) -> bytes:
        return self.prefix + zone.encode() + b":" + key

    def _tagged_key(self, zone: str, key: bytes) -> bytes:
        if self._tags is None:
            return self.prefix + zone.encode() + b":" + key
        from redis.crc import key_slot

        return self.prefix + self._tags[key_slot(key)] + zone.encode() + b":" + key

    def _next_member(self) -> bytes:
        self._member_seq += 1
        return self._member_prefix + str(self._member_seq).encode()

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
        for releaser, member in decision.taken:
            releaser.release(member)
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
        items: list[_Item] = []  # the limits that apply (their key is not empty)
        if not conn_only:
            for i, (lim, k) in enumerate(zip(route.limit_req, req_keys, strict=True)):
                if k and len(k) <= nginx_req.MAX_KEY:
                    items.append(("r", i, self._req_key(lim.zone, k), k))
            for i, (lim, k) in enumerate(zip(route.limit_count, count_keys, strict=True)):
                if k:
                    items.append(("c", i, self._tagged_key(lim.zone, k), k))
        for i, (lim, k) in enumerate(zip(route.limit_conn, conn_keys, strict=True)):
            if k and len(k) <= 255:
                items.append(("n", i, self._tagged_key(lim.zone, k), k))
        costs: list[int] = []
        if not conn_only:
            for i, (lim, (k, cost)) in enumerate(zip(route.limit_algo, algo, strict=True)):
                costs.append(lim.gcra.clamp_quantity(cost) if lim.gcra is not None else cost)
                if not k:
                    continue
                # gcra keys are untagged like limit_req: the key CL.THROTTLE would use
                key = self._req_key(lim.zone, k) if lim.type == "gcra" else self._tagged_key(lim.zone, k)
                items.append(("g", i, key, k))
        verdict = Verdict(now_ms=now)
        if not conn_only and route.limit_req:
            verdict.req = nginx_req.ReqDecision(nginx_req.DECLINED, -1, 0, 0, [None] * len(route.limit_req))
        if not conn_only and route.limit_count:
            verdict.count_used = [None] * len(route.limit_count)
            verdict.count_reset_ms = [None] * len(route.limit_count)
        if not conn_only and route.limit_algo:
            verdict.algo = [None] * len(route.limit_algo)
        wants_conn = bool(route.limit_conn) and take_conn
        if not items:
            if wants_conn:
                verdict.conn = ConnDecision(-1, False, [None] * len(route.limit_conn), [])
            return verdict
        member = self._next_member()
        if self.cluster:
            groups: dict[int, list[_Item]] = {}
            for item in items:
                groups.setdefault(self.client.keyslot(item[2]), []).append(item)
            parts = list(groups.values())
        else:
            parts = [items]
        replies: list[Any]
        try:
            if len(parts) == 1:
                replies = [await self._call_request(route, parts[0], now, wants_conn, member, costs)]
            else:
                calls = (self._call_request(route, part, now, wants_conn, member, costs) for part in parts)
                replies = await asyncio.gather(*calls, return_exceptions=True)
        except BaseException:
            # Cancelled (the client left) or failed after the script may have run: a slot
            # it took would be held by nobody. Give back whatever this request may hold.
            self._release_abandoned(member, [item[2] for item in items if item[0] == "n"] if wants_conn else [])
            raise
        results = [
            _Reply(part, r, costs, route, now)
            for part, r in zip(parts, replies, strict=True)
            if not isinstance(r, BaseException)
        ]
        failed = [r for r in replies if isinstance(r, BaseException)]
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

    async def _run_undo(self) -> None:
        """Await the undo calls for up to one ``timeout``; past that they finish in the background."""
        calls, self._pending_undo = self._pending_undo, []
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(asyncio.gather(*calls)), self.timeout)

    def _release_abandoned(self, member: bytes, keys: list[bytes]) -> None:
        if not keys:
            return
        if self.fast is not None:
            # The same connection as the script call: the ZREM cannot overtake it.
            for key in keys:
                self._queue_release(key, member)
            return
        # Other connections could run the ZREM first; wait until the call is surely done.
        loop = asyncio.get_running_loop()
        for key in keys:
            loop.call_later(max(1.0, self.timeout * 4), self._queue_release, key, member)

    async def _call_request(
        self, route: LimitSet, part: list[_Item], now: int, take_conn: bool, member: bytes, costs: list[int]
    ) -> list[Any]:
        order, tail, tail_bytes = self._static_args(route, part, take_conn)
        keys = [part[j][2] for j in order]
        part_costs = ",".join(str(costs[i]) for kd, i, _, _ in part if kd == "g")
        return list(await self._eval("request.lua", keys, [now, member, part_costs], tail, tail_bytes))

    def _static_args(self, route: LimitSet, part: list[_Item], take_conn: bool) -> tuple[list[int], list[Any], bytes]:
        """What a request.lua call carries that depends only on the route: computed once."""
        signature = (id(route), tuple((kd, i) for kd, i, _, _ in part), take_conn)
        cached = self._static.get(signature)
        if cached is not None and cached[0] is route:
            return cached[1]
        order = [j for kind in "rcng" for j, item in enumerate(part) if item[0] == kind]
        reqs = [i for kd, i, _, _ in part if kd == "r"]
        counts = [i for kd, i, _, _ in part if kd == "c"]
        conns = [i for kd, i, _, _ in part if kd == "n"]
        algos = [i for kd, i, _, _ in part if kd == "g"]
        tail: list[Any] = [1 if route.dry_run else 0, len(reqs), len(counts), len(conns)]
        tail += [1 if take_conn else 0, LEASE_MS, len(algos)]
        for i in reqs:
            lim = route.limit_req[i]
            tail += [lim.rate_m, lim.burst_m, min(lim.delay_m, 2**53), lim.ban_ms // 1000]
        for i in counts:
            lim = route.limit_count[i]
            tail += [lim.limit, lim.window_ms, 1 if lim.sliding else 0]
        for i in algos:
            tail += _algo_params(route.limit_algo[i])
        for i in conns:
            tail.append(route.limit_conn[i].max)
        value = (order, tail, encode_args(tail))
        if len(self._static) > 10_000:
            self._static.clear()
        self._static[signature] = (route, value)
        return value

    def _merge(
        self, route: LimitSet, verdict: Verdict, results: list[_Reply], wants_conn: bool, member: bytes, now: int
    ) -> Verdict:
        dry = route.dry_run
        req_fail: tuple[int, _Reply] | None = None
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
                index = result.req_items[result.delay_index - 1][0]
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
                index = result.count_items[result.count_fail - 1]
                count_fail = index if count_fail < 0 else min(count_fail, index)
            for i, outcome in result.algo_outcomes():
                verdict.algo[i] = outcome
            if result.algo_fail > 0:
                index = result.algo_items[result.algo_fail - 1]
                algo_fail = index if algo_fail < 0 else min(algo_fail, index)
            if result.conn_items:
                if not result.conn_done:
                    conn_everywhere = False
                    continue
                for i, count in result.conn_counts():
                    conn_counts[i] = count
                if result.conn_fail > 0:
                    index = result.conn_items[result.conn_fail - 1]
                    conn_fail = index if conn_fail < 0 else min(conn_fail, index)
                else:
                    taken += [(_Lease(self, key), member) for key in result.conn_keys]
        if verdict.req is not None and any(r.req_items for r in results):
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
            self.leases[member] = [lease.key for lease, _ in taken]
        return verdict

    def _undo(self, result: _Reply, member: bytes, *, req: bool, count: bool, conn: bool) -> None:
        keys: list[bytes] = []
        kinds: list[str] = []
        committed = result.rc == 1 and result.count_fail == 0 and result.algo_fail == 0
        if committed and count:
            for key, kind in result.algo_undo:
                keys.append(key)
                kinds.append(kind)
        if committed and req:
            keys += [key for _, key in result.req_keys_redis]
            kinds += ["r"] * len(result.req_keys_redis)
        if committed and count:
            keys += result.count_keys
            kinds += ["c"] * len(result.count_keys)
        if conn and result.conn_done and result.conn_fail == 0:
            keys += result.conn_keys
            kinds += ["n"] * len(result.conn_keys)
        if keys:
            self._pending_undo.append(self._undo_call(keys, kinds, member))

    async def _undo_call(self, keys: list[bytes], kinds: list[str], member: bytes) -> None:
        try:
            await self._eval("undo.lua", keys, [member, *kinds])
        except StoreUnavailable as exc:
            errorlog.log.warning("could not undo a partial decision in Redis: %s", exc)

    # -- conn leases -------------------------------------------------------------------------------
    def _queue_release(self, key: bytes, member: bytes) -> None:
        self.leases.pop(member, None)
        self._release_queue.append((key, member))
        if not self._release_scheduled:
            self._release_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_releases)

    def _flush_releases(self) -> None:
        self._release_scheduled = False
        if not self._release_queue:
            return
        batch, self._release_queue = self._release_queue, []
        spawn(self._release_batch(batch))

    async def _release_batch(self, batch: list[tuple[bytes, bytes]]) -> None:
        if self.breaker.open:
            return  # the leases run out on their own
        try:
            if self.fast is not None:
                await asyncio.gather(*(self._guard(self.fast.call("ZREM", k, m)) for k, m in batch))
            elif self.cluster:
                await asyncio.gather(*(self._guard(self.client.zrem(k, m)) for k, m in batch))
            else:
                pipe = self.client.pipeline(transaction=False)
                for key, member in batch:
                    pipe.zrem(key, member)
                await self._guard(pipe.execute())
        except StoreUnavailable as exc:
            errorlog.log.warning("could not release %d limit_conn leases (they expire): %s", len(batch), exc)

    async def _renew_leases(self) -> None:
        """Every RENEW_EVERY_S: push the lease end of live requests, and the set's own expiry."""
        while True:
            await asyncio.sleep(RENEW_EVERY_S)
            if not self.leases or self.breaker.open:
                continue
            until = self.clock_ms() + LEASE_MS
            by_key: dict[bytes, list[bytes]] = {}
            for member, keys in list(self.leases.items()):
                for key in keys:
                    by_key.setdefault(key, []).append(member)
            try:
                await asyncio.wait_for(self._renew(by_key, until), max(2.0, self.timeout * 20))
            except (TimeoutError, RedisError, OSError) as exc:
                errorlog.log.warning("could not renew %d limit_conn leases: %r", len(self.leases), exc)

    async def _renew(self, by_key: dict[bytes, list[bytes]], until: int) -> None:
        client = self.background_client()
        items = list(by_key.items())
        for start in range(0, len(items), 500):
            batch = items[start : start + 500]
            if self.cluster:
                for key, members in batch:
                    await client.zadd(key, dict.fromkeys(members, until), xx=True)
                    await client.pexpire(key, LEASE_MS * 2)
                continue
            pipe = client.pipeline(transaction=False)
            for key, members in batch:
                pipe.zadd(key, dict.fromkeys(members, until), xx=True)
                pipe.pexpire(key, LEASE_MS * 2)  # a set whose first slot is old must not expire
            await pipe.execute()

    def background_client(self) -> Any:
        """A client with a generous timeout for work off the request path (renewals)."""
        if self._background is None:
            self._background = connect(self.spec, max(1.0, self.timeout * 10))
        return self._background


def connect(spec: RedisSpec, timeout: float | None) -> Any:
    """A redis-py asyncio client for the configured topology, with no retries."""
    options: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout if timeout is not None else 2.0,
        # One immediate retry on a broken connection (a pooled one that a Redis restart
        # closed); never on a timeout, which the breaker and on_error handle.
        "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        "health_check_interval": 0,
    }
    if spec.cluster:
        from redis.asyncio.cluster import ClusterNode
        from redis.asyncio.connection import parse_url

        seeds = []
        first: dict[str, Any] = {}
        for url in spec.cluster:
            parsed: dict[str, Any] = dict(parse_url(url))
            first = first or parsed
            seeds.append(ClusterNode(parsed.get("host", "127.0.0.1"), int(parsed.get("port", 6379))))
        if timeout is None:
            # SUBSCRIBE on any node hears PUBLISH from every node of a cluster.
            return aioredis.Redis(
                host=seeds[0].host,
                port=int(seeds[0].port),
                password=first.get("password"),
                username=first.get("username"),
                **options,
            )
        return RedisCluster(
            startup_nodes=seeds,
            password=first.get("password"),
            username=first.get("username"),
            max_connections=spec.pool_size,
            require_full_coverage=False,
            **options,
        )
    if spec.sentinel is not None:
        s = spec.sentinel
        sentinel_kwargs: dict[str, Any] = {"socket_timeout": timeout or 2.0, "socket_connect_timeout": timeout or 2.0}
        if s.sentinel_password:
            sentinel_kwargs["password"] = s.sentinel_password
        sentinel = Sentinel(list(s.nodes), sentinel_kwargs=sentinel_kwargs, **options)  # type: ignore[no-untyped-call]
        return sentinel.master_for(s.master, password=s.password, db=s.db, **options)
    assert spec.url is not None
    if timeout is None:
        return aioredis.Redis.from_url(spec.url, **options)
    pool = aioredis.BlockingConnectionPool.from_url(
        spec.url, max_connections=spec.pool_size, timeout=timeout, **options
    )
    return aioredis.Redis(connection_pool=pool)


def _algo_params(limit: Any) -> list[int]:
    """request.lua's four parameters of one algo zone: its type code, then three numbers."""
    if limit.type == "gcra":
        return [1, limit.gcra.emission_ns, limit.gcra.burst, 0]
    if limit.type == "token":
        return [3, limit.token.stable_us, limit.token.warmup_us, limit.token.max_delay_us]
    return [2, limit.log.limit, limit.log.window_ms, 0]


def _quota(limit: Any) -> int | None:
    """The policy quota the gateway reports for a zone whose script does not know it (token)."""
    return int(limit.rate_text.split("r/")[0]) if limit.type == "token" else None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _undo_kind(limit: Any, cost: int, now_ms: int, fields: list[Any]) -> str:
    """undo.lua's kind for a committed algo key."""
    if limit.type == "gcra":
        return f"g{limit.gcra.emission_ns * cost}:{now_ms}"
    if limit.type == "token":
        return f"t{_text(fields[6])}|{_text(fields[7])}"  # the value before, if it still holds ours
    return "n"  # sliding_log: remove the request's member, like a conn lease


_Item = tuple[str, int, bytes, bytes]  # (kind r/c/n, limit index, Redis key, raw key)


class _Reply:
    """request.lua's reply for one group of keys, read by position."""

    def __init__(self, part: list[_Item], reply: list[Any], costs: list[int], route: LimitSet, now_ms: int) -> None:
        self.req_items = [(i, raw) for kd, i, _, raw in part if kd == "r"]
        self.req_keys_redis = [(i, key) for kd, i, key, _ in part if kd == "r"]
        self.count_items = [i for kd, i, _, _ in part if kd == "c"]
        self.count_keys = [key for kd, _, key, _ in part if kd == "c"]
        self.conn_items = [i for kd, i, _, _ in part if kd == "n"]
        self.conn_keys = [key for kd, _, key, _ in part if kd == "n"]
        self.rc, self.fail_index, self.fail_excess, self.ban_ms, self.delay_ms, self.delay_index = reply[:6]
        pos = 6
        self._excess = reply[pos : pos + len(self.req_items)]
        pos += len(self.req_items)
        self.count_fail = reply[pos]
        pos += 1
        n = len(self.count_items)
        self._used = reply[pos : pos + n]
        self._reset = reply[pos + n : pos + 2 * n]
        pos += 2 * n
        self.conn_done, self.conn_fail = reply[pos], reply[pos + 1]
        self._conn = reply[pos + 2 : pos + 2 + len(self.conn_items)]
        pos += 2 + len(self.conn_items)
        self.algo_items = [i for kd, i, _, _ in part if kd == "g"]
        self.algo_fail = reply[pos]
        self._algo = [reply[pos + 1 + 8 * a : pos + 9 + 8 * a] for a in range(len(self.algo_items))]
        self._quota = [_quota(route.limit_algo[i]) for i in self.algo_items]
        # what undo.lua takes back from each passed algo key: (key, undo kind)
        self.algo_undo = [
            (key, _undo_kind(route.limit_algo[i], costs[i], now_ms, fields))
            for (_, i, key, _), fields in zip([p for p in part if p[0] == "g"], self._algo, strict=True)
            if fields[0] == 0 and costs[i] > 0
        ]
        self.now_ms = now_ms

    def excesses(self) -> list[tuple[int, int]]:
        return [(i, e) for (i, _), e in zip(self.req_items, self._excess, strict=True) if e >= 0]

    def counts(self) -> list[tuple[int, int, int]]:
        return [(i, u, r) for i, u, r in zip(self.count_items, self._used, self._reset, strict=True) if u >= 0]

    def algo_outcomes(self) -> list[tuple[int, AlgoOutcome]]:
        # the script answers CL.THROTTLE's fields: limited first
        return [
            (i, AlgoOutcome(f[0] == 0, quota if quota is not None else f[1], f[2], f[3], f[4], f[5]))
            for i, f, quota in zip(self.algo_items, self._algo, self._quota, strict=True)
            if f[0] >= 0
        ]

    def conn_counts(self) -> list[tuple[int, int]]:
        return [(i, c) for i, c in zip(self.conn_items, self._conn, strict=True) if c >= 0]
