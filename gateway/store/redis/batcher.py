"""One script call for many requests: the batcher of the Redis store.

Requests ask for their decisions with ``request``; the batcher gathers every
operation asked in one event-loop tick, and all those asked while the previous
batch of the same group is on the wire, into one call of ``batch.lua``: one socket
write, one script call, one reply. Each request's future resolves when that reply
arrives. So at low load a call carries one request and costs no added latency, and
under load a call carries what arrived during one round trip.

* Groups: the keys of one call must share a slot on Redis Cluster, so there is one
  queue per slot (``ScriptClient.slot``); a standalone or Sentinel Redis has one.
* A late reply does not hold the next batch for a second round trip: a batch queued
  behind one on the wire goes out anyway once that one has waited ``late_after()``
  (twice the recent round trip, ``LATE_MIN_S`` at least), at most ``MAX_ON_WIRE`` per
  group. Redis then reads both at its next wakeup; a stall of the Redis process (a busy
  core, a fork) costs the requests queued behind it one stall, not two. Under load a
  round trip is a loop iteration, and the twice-that bar keeps batches as large as before.
* One deadline per batch, armed when its first operation is queued: a batch that
  has no reply ``timeout`` after that fails all its requests (StoreUnavailable) and
  drops the connection it waits on; the breaker counts that as one failure.
* limit_conn releases and lease renewals (``release``, ``renew``) ride in batches,
  never a command of their own. A release is sent at once, with whatever its group
  has queued, when no batch of that group is on the wire, else in the one filling
  meanwhile: it does not wait for company, because the request gives its slots back
  just before its response's last bytes go out, and the client's next request, maybe
  to another node, must find them free.
* While the circuit is open, ``request`` raises at once. Releases and renewals
  are kept (up to ``MAX_HELD``) and sent when it closes, as are those of a batch
  that failed (``MAX_TRIES`` times at most: ZREM and ZADD XX are safe to repeat);
  past that, the leases run out on their own.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from gateway.background import spawn
from gateway.clock import Deadline
from gateway.errors import StoreUnavailable
from gateway.logs import error as errorlog
from gateway.store import lua
from gateway.store.redis.breaker import Breaker
from gateway.store.redis.client import CALL_ERRORS, ERROR_REPLY, NO_SCRIPT, ScriptClient
from gateway.store.resp import NoScript, encode_args

SCRIPT = "batch.lua"
MAX_IN_FLIGHT = 1  # batches on the wire per group: the next one fills meanwhile
MAX_ON_WIRE = 2  # ... and with the one on the wire late, one more
LATE_MIN_S = 0.001  # a reply is late after twice the recent round trip, and never before this
RTT_WEIGHT = 0.125  # the recent round trip: an exponential average of the replies' (TCP's SRTT weight)
MAX_HELD = 10_000  # releases and renewals kept while the circuit is open
MAX_TRIES = 3


def _request_args(now_ms: int, member: bytes, costs: str) -> bytes:
    """A request operation's own arguments, encoded (``encode_args`` for this one shape)."""
    stamp, cost = b"%d" % now_ms, costs.encode()
    return b"$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(stamp), stamp, len(member), member, len(cost), cost)


class _Op:
    __slots__ = ("args", "future", "group", "keys", "kind", "tail", "tail_bytes", "tries")

    def __init__(
        self,
        kind: bytes,
        keys: Sequence[bytes],
        args: Sequence[Any],
        tail: Sequence[Any] = (),
        tail_bytes: bytes = b"",
        future: asyncio.Future[Any] | None = None,
    ) -> None:
        self.kind = kind
        self.keys = keys
        self.args = args
        self.tail = tail
        self.tail_bytes = tail_bytes
        self.future = future
        self.group = 0
        self.tries = 0


class _Batch:
    __slots__ = ("group", "late", "ops", "sent", "task", "timed_out", "timer")

    def __init__(self, group: int) -> None:
        self.group = group
        self.ops: list[_Op] = []
        self.sent = False
        self.timed_out = False
        self.timer: Deadline | None = None
        self.late: Deadline | None = None  # sends it if the batch on the wire is late
        self.task: asyncio.Task[Any] | None = None

    def stop_late(self) -> None:
        if self.late is not None:
            self.late.cancel()
            self.late = None


class Batcher:
    def __init__(
        self,
        client: ScriptClient,
        breaker: Breaker,
        timeout: float,
        load_scripts: Callable[[], Awaitable[None]],
    ) -> None:
        self.client = client
        self.breaker = breaker
        self.timeout = timeout
        self.load_scripts = load_scripts
        self.sha = lua.sha1(SCRIPT)
        self._pending: dict[int, _Batch] = {}
        self._in_flight: dict[int, int] = {}
        self._scheduled: dict[int, asyncio.Handle] = {}
        self._held: list[_Op] = []  # releases and renewals waiting for the circuit to close
        self._heads: dict[tuple[Any, ...], bytes] = {}
        # The loop, looked up once: asyncio.get_running_loop() makes a getpid() system call on
        # Python 3.11, two per request here otherwise.
        self._loop: asyncio.AbstractEventLoop | None = None
        breaker.on_close.append(self._resume)
        self.rtt = 0.0  # the recent round trip of a batch, seconds (exponential average)
        # figures: batches sent, the operations they carried, those sent past a late one
        self.batches = 0
        self.operations = 0
        self.sent_past_late = 0

    # -- queueing ----------------------------------------------------------------------------------
    def request(
        self, group: int, keys: Sequence[bytes], args: Sequence[Any], tail: Sequence[Any], tail_bytes: bytes
    ) -> asyncio.Future[Any]:
        """Queue one request.lua call; a future of its reply (a list)."""
        if self.breaker.open:
            self.breaker.observe("circuit_open", 0.0)
            raise StoreUnavailable("Redis circuit is open")
        future: asyncio.Future[Any] = self._running_loop().create_future()
        self._add(group, _Op(b"q", keys, args, tail, tail_bytes, future))
        return future

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None or loop.is_closed():  # first use, or a store used again on a new loop
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def release(self, group: int, keys: Sequence[bytes], member: bytes) -> None:
        """Remove ``member``'s leases from ``keys`` (one slot): sent at once when that group has
        no batch on the wire (a client's next request, maybe to another node, must find the
        slot free), else in the batch filling meanwhile."""
        self._upkeep(group, _Op(b"x", keys, (member,)))
        self._flush_now(group)

    def renew(self, group: int, key: bytes, until_ms: int, set_ttl_ms: int, members: Sequence[bytes]) -> None:
        """Push the lease end of ``members`` of ``key`` (ZADD XX), and the set's expiry, in the next batch."""
        self._upkeep(group, _Op(b"w", (key,), (until_ms, set_ttl_ms, *members)))

    def _upkeep(self, group: int, op: _Op) -> None:
        op.group = group
        if self.breaker.open:
            if len(self._held) < MAX_HELD:
                self._held.append(op)
        else:
            self._add(group, op)

    def _retry(self, op: _Op) -> None:
        """A release or renewal whose batch failed: once more (ZREM, ZADD XX are safe to repeat)."""
        op.tries += 1
        if op.tries < MAX_TRIES:
            self._upkeep(op.group, op)
        else:
            errorlog.log.warning("could not release or renew a limit_conn lease in Redis (it runs out)")

    def _resume(self) -> None:
        held, self._held = self._held, []
        for op in held:
            self._add(op.group, op)

    def _add(self, group: int, op: _Op) -> None:
        batch = self._pending.get(group)
        if batch is None:
            batch = self._pending[group] = _Batch(group)
            batch.timer = Deadline(self.timeout, self._expire, batch)
        batch.ops.append(op)
        if self._in_flight.get(group, 0) >= MAX_IN_FLIGHT:
            # sent when the reply of the one on the wire arrives, or when that reply is late
            if batch.late is None and self._in_flight[group] < MAX_ON_WIRE:
                # judged after the loop has read its sockets once more: a busy loop's own
                # iteration is no late reply, and the reply may be waiting unread
                batch.late = Deadline(self.late_after(), self._send_past_late, batch)
            return
        if group not in self._scheduled:
            self._scheduled[group] = self._running_loop().call_soon(self._flush, group)

    def late_after(self) -> float:
        return max(LATE_MIN_S, 2 * self.rtt)

    def _send_past_late(self, batch: _Batch) -> None:
        batch.late = None
        group = batch.group
        if self._pending.get(group) is batch and self._in_flight.get(group, 0) < MAX_ON_WIRE:
            self.sent_past_late += 1
            self._flush(group)

    def _flush(self, group: int) -> None:
        self._scheduled.pop(group, None)
        batch = self._pending.pop(group, None)
        if batch is None:
            return
        batch.stop_late()
        batch.sent = True
        self._in_flight[group] = self._in_flight.get(group, 0) + 1
        if not self.breaker.open:
            # The common case, with no task: written now on an open connection, the reply
            # handled by a callback. Otherwise (connecting, NOSCRIPT to recover): _send.
            keys, args, args_bytes, nargs = self._encode(batch)
            reply = self.client.send_now(self.sha, keys, args, args_bytes, nargs)
            if reply is not None:
                self.batches += 1
                self.operations += len(batch.ops)
                reply.add_done_callback(functools.partial(self._on_reply, batch, time.monotonic()))
                return
        batch.task = spawn(self._send(batch))

    def _on_reply(self, batch: _Batch, started: float, reply: asyncio.Future[Any]) -> None:
        if reply.cancelled():
            self._failed(batch, TimeoutError("Redis did not answer in time"), started)
        elif isinstance(reply.exception(), NO_SCRIPT) and not batch.timed_out:
            batch.task = spawn(self._send(batch, counted=True))  # load the scripts, send again
            return
        elif reply.exception() is not None:
            exc = reply.exception()
            assert exc is not None
            self._failed(batch, TimeoutError(str(exc)) if batch.timed_out else exc, started)
        else:
            self._deliver(batch, reply.result(), started)
        self._done(batch)

    def _done(self, batch: _Batch) -> None:
        group = batch.group
        self._in_flight[group] -= 1
        if batch.timer is not None:
            batch.timer.cancel()
        if group in self._pending and group not in self._scheduled and self._in_flight[group] < MAX_IN_FLIGHT:
            self._scheduled[group] = self._running_loop().call_soon(self._flush, group)

    # -- one call ----------------------------------------------------------------------------------
    async def _send(self, batch: _Batch, *, counted: bool = False) -> None:
        started = time.monotonic()
        try:
            if self.breaker.open:
                self.breaker.calls["circuit_open"] += 1
                self._fail(batch, StoreUnavailable("Redis circuit is open"))
                return
            keys, args, args_bytes, nargs = self._encode(batch)
            if not counted:
                self.batches += 1
                self.operations += len(batch.ops)
            try:
                try:
                    if counted:
                        raise NoScript("NOSCRIPT (answered to the first try)")
                    replies = await self.client.evalsha(self.sha, keys, args, args_bytes, nargs)
                except NO_SCRIPT:
                    # Redis restarted or failed over: its script cache is empty. Load, retry once.
                    errorlog.log.warning("Redis lost its scripts (NOSCRIPT): loading them again")
                    await self.load_scripts()
                    replies = await self.client.evalsha(self.sha, keys, args, args_bytes, nargs)
            except asyncio.CancelledError:
                if not batch.timed_out:
                    raise
                self._failed(batch, TimeoutError("Redis did not answer in time"), started)
                return
            except CALL_ERRORS as exc:
                self._failed(batch, TimeoutError(str(exc)) if batch.timed_out else exc, started)
                return
            self._deliver(batch, replies, started)
        finally:
            self._done(batch)

    def _deliver(self, batch: _Batch, replies: list[Any], started: float) -> None:
        took = time.monotonic() - started
        self.rtt = took if not self.rtt else self.rtt + RTT_WEIGHT * (took - self.rtt)  # seeded by the first
        self.breaker.success()
        self.breaker.observe("ok", took)
        for op, reply in zip(batch.ops, replies, strict=True):
            future = op.future
            if future is None or future.done():
                continue
            if isinstance(reply, (bytes, str)):  # this request's own error, the others ran
                future.set_exception(StoreUnavailable(f"Redis error: {reply!r}"))
            else:
                future.set_result(reply)

    def _encode(self, batch: _Batch) -> tuple[list[bytes], list[Any], bytes, int]:
        """batch.lua's KEYS and ARGV: as a list, or RESP-encoded for a client that takes bytes.

        A request's route-fixed arguments (its ``tail``) go once per call as a plan, which
        its operation names by number: the requests of one busy route share one."""
        keys: list[bytes] = []
        plans: dict[bytes, int] = {}
        plan_args: list[Any] = []
        op_args: list[Any] = []
        encoded = self.client.encoded
        plan_chunks: list[bytes] = []
        op_chunks: list[bytes] = []
        nargs = 2
        for op in batch.ops:
            keys += op.keys
            if op.kind == b"q":
                plan = plans.get(op.tail_bytes)
                if plan is None:
                    plan = plans[op.tail_bytes] = len(plans) + 1
                    nargs += 1 + len(op.tail)
                    if encoded:
                        plan_chunks.append(encode_args([len(op.tail)]))
                        plan_chunks.append(op.tail_bytes)
                    else:
                        plan_args.append(len(op.tail))
                        plan_args += op.tail
                head = [op.kind, len(op.keys), 1 + len(op.args), plan]
            else:
                head = [op.kind, len(op.keys), len(op.args)]
            nargs += len(head) + len(op.args)
            if encoded:
                op_chunks.append(self._head_bytes(head))
                op_chunks.append(_request_args(*op.args) if op.kind == b"q" else encode_args(op.args))
            else:
                op_args += head
                op_args += op.args
        counts = [len(batch.ops), len(plans)]
        if encoded:
            return keys, [], encode_args(counts) + b"".join(plan_chunks) + b"".join(op_chunks), nargs
        return keys, counts + plan_args + op_args, b"", nargs

    def _head_bytes(self, head: list[Any]) -> bytes:
        """An operation's head (kind, key count, argument count, plan), encoded: a few hundred
        distinct ones at most, so encoded once each."""
        key = tuple(head)
        data = self._heads.get(key)
        if data is None:
            if len(self._heads) > 10_000:
                self._heads.clear()
            data = self._heads[key] = encode_args(head)
        return data

    def _expire(self, batch: _Batch) -> None:
        """The batch's deadline passed without a reply (judged after one more poll: ``Deadline``)."""
        if batch.sent:
            batch.timed_out = True
            self.client.abort("Redis did not answer in time")
            if batch.task is not None and not batch.task.done():
                batch.task.cancel()
            return
        # Still queued behind a batch that hangs: fail it now, within the deadline.
        if self._pending.get(batch.group) is batch:
            del self._pending[batch.group]
        batch.stop_late()
        self._failed(batch, TimeoutError("Redis did not answer in time"), None)

    def _failed(self, batch: _Batch, exc: BaseException, started: float | None) -> None:
        took = time.monotonic() - started if started is not None else self.timeout
        if isinstance(exc, ERROR_REPLY) and not isinstance(exc, NO_SCRIPT):
            self.breaker.observe("error", took)
            error = StoreUnavailable(f"Redis error: {exc}")
        else:
            self.breaker.observe("timeout" if isinstance(exc, TimeoutError) else "unavailable", took)
            if not self.breaker.open:
                self.breaker.failure()  # the second in a row opens the circuit and starts the probe
            error = StoreUnavailable(f"Redis unavailable: {exc!r}")
        self._fail(batch, error)

    def _fail(self, batch: _Batch, error: StoreUnavailable) -> None:
        for op in batch.ops:
            if op.future is None:
                self._retry(op)  # a release or renewal: again, once the circuit is closed
            elif not op.future.done():
                op.future.set_exception(error)

    def flush_all(self) -> None:
        """Send every queued batch whose group has none on the wire, without waiting for a tick."""
        for group in list(self._pending):
            self._flush_now(group)

    def _flush_now(self, group: int) -> None:
        """Send ``group``'s queued batch now, unless one of its batches is on the wire."""
        if group in self._pending and self._in_flight.get(group, 0) < MAX_IN_FLIGHT:
            scheduled = self._scheduled.pop(group, None)
            if scheduled is not None:
                scheduled.cancel()
            self._flush(group)

    async def idle(self) -> None:
        """Until nothing is queued or on the wire."""
        while self._pending or any(self._in_flight.values()):
            self.flush_all()
            await asyncio.sleep(0.001)

    def close(self) -> None:
        for handle in self._scheduled.values():
            handle.cancel()
        self._scheduled.clear()
        for batch in self._pending.values():
            if batch.timer is not None:
                batch.timer.cancel()
            batch.stop_late()
            for op in batch.ops:
                if op.future is not None and not op.future.done():
                    op.future.set_exception(StoreUnavailable("the store is closed"))
        self._pending.clear()
        self._held.clear()
