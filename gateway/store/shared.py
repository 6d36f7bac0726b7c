"""One embedded store for a node with several workers, like nginx's shared-memory zones.

With ``workers: N`` and no Redis, the master process owns a ``MemoryStore`` and
serves it on a Unix socket; each worker's ``SharedStoreClient`` asks it for every
decision, so a limit counts all the node's traffic, not one worker's share.

Wire format: frames of a 4-byte big-endian length and a ``marshal``-encoded tuple
(master and workers are the same program; nothing else connects).

    worker -> master   (DEFINE, desc_id, description)     once per route and connection
                       (ADMIT, req_id, desc_id, req_keys, count_keys, conn_keys, algo uses)
                       (CONN, req_id, desc_id, conn_keys)
                       (RELEASE, lease_id)
    master -> worker   (req_id, verdict tuple) or (req_id, None, error text)
                       (0, [ban JSON, ...], [target, ...], part)   manual bans added, removed:
                       part 0 = a change; on connect, the whole list as parts 1 ... then an
                       empty part 2 (the worker then drops what the list no longer holds)

Slots taken for a worker are leases; if the worker's connection drops (it died),
the master releases everything it held.

Frames are batched both ways: a worker writes the frames of one event-loop tick in
one write (a RELEASE goes at once, with whatever is queued); the master decodes every
frame of one read and answers them in one write.
"""

from __future__ import annotations

import asyncio
import contextlib
import marshal
import struct
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from gateway.bans.local import Ban
from gateway.clock import Deadline
from gateway.errors import StoreUnavailable
from gateway.limits import conn as conn_logic
from gateway.limits.conn import ConnDecision
from gateway.limits.nginx_req import ReqDecision
from gateway.limits.outcome import AlgoOutcome
from gateway.limits.params import AlgoParams, ConnParams, CountParams, ReqParams, RouteLimits, field_names
from gateway.limits.registry import algo_type
from gateway.logs import error as errorlog
from gateway.store.base import AlgoUse, LimitSet, Verdict
from gateway.store.memory import MemoryStore

DEFINE, ADMIT, CONN, RELEASE = 1, 2, 3, 4
_HEADER = struct.Struct(">I")
MAX_FRAME = 16 * 1024 * 1024
READ_SIZE = 256 * 1024
BANS_PER_FRAME = 500  # a worker applies one frame in a few ms, then serves again
CHANGE, SNAPSHOT, SNAPSHOT_END = 0, 1, 2


# -- the limit description a worker sends once per route ---------------------------------------


# The fields of each record, in order: a description is these values, record by record.
_REQ, _COUNT, _CONN = field_names(ReqParams), field_names(CountParams), field_names(ConnParams)


def describe(route: LimitSet) -> tuple[Any, ...]:
    return (
        tuple(tuple(getattr(r, name) for name in _REQ) for r in route.limit_req),
        tuple(tuple(getattr(c, name) for name in _COUNT) for c in route.limit_count),
        tuple(tuple(getattr(c, name) for name in _CONN) for c in route.limit_conn),
        route.dry_run,
        # an algo zone: its zone, its type, and its type's parameter record field by field
        tuple(
            (a.zone, a.type, tuple(getattr(a.params, name) for name in a.algo.field_names)) for a in route.limit_algo
        ),
    )


def _limits(description: tuple[Any, ...]) -> RouteLimits:
    req, count, conn, dry, algo = description
    return RouteLimits(
        limit_req=tuple(ReqParams(*r) for r in req),
        limit_count=tuple(CountParams(*c) for c in count),
        limit_conn=tuple(ConnParams(*c) for c in conn),
        dry_run=bool(dry),
        limit_algo=tuple(AlgoParams(zone, kind, algo_type(kind).params(*params)) for zone, kind, params in algo),
    )


def _encode_conn(decision: ConnDecision | None, lease: int) -> tuple[Any, ...] | None:
    if decision is None:
        return None
    return (decision.rejected, decision.zone_full, decision.counts, lease)


def _encode_verdict(verdict: Verdict, lease: int) -> tuple[Any, ...]:
    req = verdict.req
    req_t = None
    if req is not None:
        req_t = (req.rc, req.index, req.excess, req.delay_ms, req.excesses, req.ban_until, req.new_ban)
    return (
        verdict.now_ms,
        req_t,
        verdict.count_rejected,
        verdict.count_used,
        verdict.count_reset_ms,
        _encode_conn(verdict.conn, lease),
        verdict.algo_rejected,
        [None if a is None else a.encode() for a in verdict.algo],
    )


async def _read_frames(reader: asyncio.StreamReader) -> AsyncIterator[list[Any]]:
    """The messages of each read, as they come: a busy peer's frames arrive many to a read, and
    are decoded together rather than with two awaits each. Ends at EOF."""
    buffer = bytearray()
    while True:
        data = await reader.read(READ_SIZE)
        if not data:
            return
        buffer += data
        messages = []
        at = 0
        while len(buffer) - at >= 4:
            (size,) = _HEADER.unpack_from(buffer, at)
            if size > MAX_FRAME:
                raise ValueError(f"frame of {size} bytes")
            if len(buffer) - at - 4 < size:
                break
            messages.append(marshal.loads(buffer[at + 4 : at + 4 + size]))
            at += 4 + size
        del buffer[:at]
        if messages:
            yield messages


def _frame(message: tuple[Any, ...]) -> bytes:
    data = marshal.dumps(message)
    return _HEADER.pack(len(data)) + data


def _ban_frames(adds: list[str], removes: list[str], part: int) -> Iterator[bytes]:
    for i in range(0, max(len(adds), 1), BANS_PER_FRAME):
        yield _frame((0, adds[i : i + BANS_PER_FRAME], removes[:BANS_PER_FRAME] if i == 0 else [], part))
    for i in range(BANS_PER_FRAME, len(removes), BANS_PER_FRAME):
        yield _frame((0, [], removes[i : i + BANS_PER_FRAME], part))


# -- master side -----------------------------------------------------------------------------------


class SharedStoreServer:
    """Serves a MemoryStore to the workers of this node."""

    def __init__(self, store: MemoryStore, path: str) -> None:
        self.store = store
        self.path = path
        self._server: asyncio.AbstractServer | None = None
        self._next_lease = 1
        self._writers: set[asyncio.StreamWriter] = set()
        self._bans: dict[str, str] = {}  # target -> ban JSON: what a worker gets when it connects

    def push_bans(self, added: Sequence[Ban], removed: Sequence[str]) -> None:
        """Send one change of the node's ban list to every worker (they only ever read their copy)."""
        adds = [ban.to_json() for ban in added]
        for ban, text in zip(added, adds, strict=True):
            self._bans[ban.target] = text
        for target in removed:
            self._bans.pop(target, None)
        for frame in _ban_frames(adds, list(removed), CHANGE):
            for writer in list(self._writers):
                writer.write(frame)

    def _snapshot(self) -> Iterator[bytes]:
        yield from _ban_frames(list(self._bans.values()), [], SNAPSHOT)
        yield _frame((0, [], [], SNAPSHOT_END))

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=self.path)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        routes: dict[int, RouteLimits] = {}
        leases: dict[int, ConnDecision] = {}
        store = self.store
        self._writers.add(writer)
        for frame in self._snapshot():
            writer.write(frame)
        try:
            async for messages in _read_frames(reader):
                replies = []  # the answers to one read go out in one write
                for message in messages:
                    kind = message[0]
                    if kind == RELEASE:
                        decision = leases.pop(message[1], None)
                        if decision is not None:
                            conn_logic.release(decision.taken)
                        continue
                    if kind == DEFINE:
                        routes[message[1]] = _limits(message[2])
                        continue
                    req_id = message[1]
                    try:
                        limits = routes[message[2]]
                        if kind == ADMIT:
                            algo = [(key, cost) for key, cost in message[6]]
                            verdict = store.decide(limits, message[3], message[4], message[5], algo)
                            lease = self._lease(leases, verdict.conn)
                            reply: tuple[Any, ...] = (req_id, _encode_verdict(verdict, lease))
                        else:
                            decision = store.take_conn(limits, message[3])
                            reply = (req_id, _encode_conn(decision, self._lease(leases, decision)))
                    except Exception as exc:  # e.g. a zone reloaded with another type: answer, stay up
                        reply = (req_id, None, f"cannot decide ({exc!r})")
                    replies.append(_frame(reply))
                if replies:
                    writer.write(b"".join(replies))
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            for decision in leases.values():  # the worker is gone: its slots with it
                conn_logic.release(decision.taken)
            self._writers.discard(writer)
            writer.close()

    def _lease(self, leases: dict[int, ConnDecision], decision: ConnDecision | None) -> int:
        if decision is None or not decision.taken:
            return 0
        lease = self._next_lease
        self._next_lease += 1
        leases[lease] = decision
        return lease


# -- worker side -----------------------------------------------------------------------------------


def _time_out(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


class SharedStoreClient:
    """The Store a worker uses when the master owns the node's embedded store."""

    kind = "shared"
    on_error = "allow"  # the master's store did not answer in time: let the request through

    def __init__(self, path: str, timeout: float = 1.0) -> None:
        self.path = path
        self.timeout = timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._routes: dict[int, tuple[LimitSet, int]] = {}
        self._next_id = 1
        self._reader_task: asyncio.Task[None] | None = None
        self._reconnect_task: asyncio.Task[None] | None = None
        self._abandoned: dict[int, int] = {}  # request id -> kind, for replies nobody waits for
        self._closing = False
        self._out: list[bytes] = []  # frames queued in this tick
        self.on_bans: Callable[[list[Ban], list[str], int], None] | None = None

    def configure(self, zones: Any) -> None:
        """Zones live in the master, which reloads before it signals the workers."""

    def status(self) -> dict[str, Any]:
        return {}  # the zones are the master's

    def deliver_bans(self, sink: Callable[[list[Ban], list[str], int], None]) -> bool:
        """The master pushes its ban changes to each worker along the store's socket."""
        self.on_bans = sink
        return True

    async def start(self, wait: float = 10.0) -> None:
        deadline = asyncio.get_running_loop().time() + wait
        while True:
            try:
                self._reader, self._writer = await asyncio.open_unix_connection(self.path)
                break
            except OSError:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.05)
        self._routes.clear()
        self._out.clear()
        self._reader_task = asyncio.ensure_future(self._read_replies())

    async def _read_replies(self) -> None:
        assert self._reader is not None
        try:
            async for messages in _read_frames(self._reader):
                for message in messages:
                    if message[0] == 0:
                        if self.on_bans is not None:
                            self.on_bans([Ban.from_json(text) for text in message[1]], message[2], message[3])
                            await asyncio.sleep(0)  # one frame at a time: serve between two
                        continue
                    future = self._pending.pop(message[0], None)
                    if future is not None and not future.done():
                        future.set_result(message)
                    else:
                        self._release_abandoned(message)
            if not self._closing:
                errorlog.log.error("lost the connection to the master's store: it closed")
        except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            errorlog.log.error("lost the connection to the master's store: %r", exc)
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(StoreUnavailable("master store connection lost"))
            self._pending.clear()
            self._abandoned.clear()  # the master released everything of this connection
            self._writer = None
            if not self._closing:
                self._reconnect_task = asyncio.ensure_future(self._reconnect())

    def _release_abandoned(self, message: tuple[Any, ...]) -> None:
        """The caller of this request gave up (client gone, timeout): free what it was granted."""
        kind = self._abandoned.pop(message[0], None)
        if kind is None or len(message) > 2 or message[1] is None:
            return
        conn_t = message[1][5] if kind == ADMIT else message[1]
        if conn_t is not None and conn_t[3]:
            with contextlib.suppress(StoreUnavailable):
                self._send((RELEASE, conn_t[3]))

    async def _reconnect(self) -> None:
        delay = 0.05
        while not self._closing:
            await asyncio.sleep(delay)
            try:
                self._reader, self._writer = await asyncio.open_unix_connection(self.path)
            except OSError:
                delay = min(delay * 2, 1.0)
                continue
            self._routes.clear()  # descriptions are per connection: send them again
            self._out.clear()
            errorlog.log.log(errorlog.NOTICE, "reconnected to the master's store")
            self._reader_task = asyncio.ensure_future(self._read_replies())
            return

    def _route_id(self, route: LimitSet) -> int:
        known = self._routes.get(id(route))
        if known is not None and known[0] is route:
            return known[1]
        desc_id = self._next_id
        self._next_id += 1
        self._send((DEFINE, desc_id, describe(route)))
        self._routes[id(route)] = (route, desc_id)
        return desc_id

    def _send(self, message: tuple[Any, ...]) -> None:
        """Queue a frame: the frames of one event-loop tick go to the master in one write."""
        if self._writer is None:
            raise StoreUnavailable("no connection to the master's store")
        self._out.append(_frame(message))
        if len(self._out) == 1:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if out and self._writer is not None:  # (a lost connection failed their callers already)
            self._writer.write(b"".join(out))

    async def _call(self, message: tuple[Any, ...]) -> Any:
        req_id = message[1]
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending[req_id] = future
        timer: Deadline | None = None
        try:
            self._send(message)
            timer = Deadline(self.timeout, _time_out, future)  # judged after one more poll
            reply = await future
        except TimeoutError:
            self._abandoned[req_id] = message[0]
            raise StoreUnavailable("the master's store did not answer in time") from None
        except asyncio.CancelledError:
            self._abandoned[req_id] = message[0]  # its reply may grant a slot: released on arrival
            raise
        finally:
            self._pending.pop(req_id, None)
            if timer is not None:
                timer.cancel()
        if len(reply) > 2:
            raise StoreUnavailable(reply[2])
        return reply[1]

    def _request_id(self) -> int:
        self._next_id += 1
        return self._next_id

    async def admit(
        self,
        route: LimitSet,
        req_keys: Sequence[bytes],
        count_keys: Sequence[bytes],
        conn_keys: Sequence[bytes],
        algo: Sequence[AlgoUse] = (),
    ) -> Verdict:
        desc = self._route_id(route)
        message = (ADMIT, self._request_id(), desc, list(req_keys), list(count_keys), list(conn_keys), list(algo))
        payload = await self._call(message)
        now_ms, req_t, count_rejected, count_used, count_reset, conn_t, algo_rejected, algo_t = payload
        verdict = Verdict(
            now_ms=now_ms,
            count_rejected=count_rejected,
            count_used=count_used,
            count_reset_ms=count_reset,
            algo_rejected=algo_rejected,
            algo=[None if a is None else AlgoOutcome.decode(a) for a in algo_t],
        )
        if req_t is not None:
            rc, index, excess, delay_ms, excesses, ban_until, new_ban = req_t
            verdict.req = ReqDecision(rc, index, excess, delay_ms, excesses, ban_until=ban_until, new_ban=new_ban)
        verdict.conn = self._conn(conn_t)
        return verdict

    async def acquire_conn(self, route: LimitSet, conn_keys: Sequence[bytes]) -> ConnDecision:
        desc = self._route_id(route)
        decision = self._conn(await self._call((CONN, self._request_id(), desc, list(conn_keys))))
        assert decision is not None
        return decision

    def _conn(self, conn_t: tuple[Any, ...] | None) -> ConnDecision | None:
        if conn_t is None:
            return None
        rejected, zone_full, counts, lease = conn_t
        return ConnDecision(rejected, zone_full, counts, [(self, lease)] if lease else [])

    def release(self, route: LimitSet, decision: ConnDecision) -> None:
        for _, lease in decision.taken:
            # if the connection is gone, the master releases the lost connection's slots itself
            with contextlib.suppress(StoreUnavailable):
                self._send((RELEASE, lease))
        decision.taken = []
        # At once, with whatever this tick queued: the pipeline gives slots back just before the
        # response's last bytes, and the client's next request (maybe to another worker) must
        # find them free.
        self._flush()

    async def close(self) -> None:
        self._closing = True
        self._flush()  # the releases queued last
        if self._writer is not None:
            self._writer.close()
        for task in (self._reader_task, self._reconnect_task):
            if task is not None:
                task.cancel()
