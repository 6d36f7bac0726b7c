"""The master <-> worker stats channel of ``workers: N``: one scrape of the master gives the node.

The master listens on a Unix socket in its private temporary directory and passes its path to
the workers in ``GATEWAY_STATS_SOCKET`` (in both store modes). Each worker connects at start
and says who it is; when the master is scraped it writes one byte to every connected worker,
each answers with a snapshot of its registered providers, and the master merges them per
provider. Pulling at scrape time keeps counts exact right after the requests.

What travels is generic: ``register(name, snapshot, merge, retire)`` adds a provider. A worker
sends ``{name: snapshot()}``; the master calls ``merge([...])`` with one item per worker. Frames
are a 4-byte big-endian length and JSON.

Workers come and go:
* a worker that does not answer within ``ASK_TIMEOUT_S`` (1 s) counts with its last snapshot
  (or not at all, if it never answered): a stuck worker never hangs a scrape;
* a worker that stops sends a final snapshot before it closes the connection; when the
  connection ends, the master keeps ``retire(last snapshot)`` (for the metrics: the counters
  and histograms, not the gauges) folded into a "retired" total, so counters never go back.
  A worker killed outright loses what it counted since the last scrape.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.background import spawn
from gateway.logs import error as errorlog

STATS_ENV = "GATEWAY_STATS_SOCKET"
ASK_TIMEOUT_S = 1.0
HELLO_TIMEOUT_S = 5.0
MAX_FRAME = 64 * 1024 * 1024
ASK = b"?"


@dataclass(frozen=True, slots=True)
class Provider:
    snapshot: Callable[[], Any]  # worker side: this process's data, JSON-able
    merge: Callable[[Sequence[Any]], Any]  # master side: the node's data from every worker's
    retire: Callable[[Any], Any]  # what a worker that is gone leaves in the totals


PROVIDERS: dict[str, Provider] = {}


def register(
    name: str,
    snapshot: Callable[[], Any],
    merge: Callable[[Sequence[Any]], Any],
    retire: Callable[[Any], Any] = lambda data: data,
) -> None:
    PROVIDERS[name] = Provider(snapshot, merge, retire)


def local_snapshot() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, provider in PROVIDERS.items():
        try:
            out[name] = provider.snapshot()
        except Exception:
            errorlog.log.exception("stats provider %s failed", name)
    return out


def merged(snapshots: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per provider, the merge of every snapshot that has it."""
    return {
        name: provider.merge([snap[name] for snap in snapshots if name in snap]) for name, provider in PROVIDERS.items()
    }


def _frame(data: Any) -> bytes:
    body = json.dumps(data, separators=(",", ":")).encode()
    return len(body).to_bytes(4, "big") + body


async def _read_frame(reader: asyncio.StreamReader) -> Any:
    size = int.from_bytes(await reader.readexactly(4), "big")
    if size > MAX_FRAME:
        raise ValueError("stats frame too large")
    return json.loads(await reader.readexactly(size))


# -- the worker side ---------------------------------------------------------------------------
class StatsClient:
    def __init__(self, path: str) -> None:
        self.path = path
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        try:
            reader, writer = await asyncio.open_unix_connection(self.path)
        except OSError as exc:
            errorlog.log.error("stats channel to the master not open (%s): this worker is not in /metrics", exc)
            return
        self._writer = writer
        writer.write(_frame({"pid": os.getpid()}))
        self._task = spawn(self._serve(reader, writer))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while await reader.readexactly(1):
                writer.write(_frame(local_snapshot()))
                await writer.drain()

    async def close(self) -> None:
        """Send the last snapshot (what this worker counted, for the retired totals), then close."""
        if self._task is not None:
            self._task.cancel()
        writer = self._writer
        if writer is None:
            return
        self._writer = None
        with contextlib.suppress(Exception):
            writer.write(_frame(local_snapshot()))
            await asyncio.wait_for(writer.drain(), ASK_TIMEOUT_S)
            writer.close()


# -- the master side ---------------------------------------------------------------------------
class _Worker:
    __slots__ = ("latest", "pid", "waiter", "writer")

    def __init__(self, pid: int, writer: asyncio.StreamWriter) -> None:
        self.pid = pid
        self.writer = writer
        self.latest: dict[str, Any] | None = None
        self.waiter: asyncio.Future[dict[str, Any] | None] | None = None


class StatsServer:
    def __init__(self, path: str) -> None:
        self.path = path
        self.live: dict[int, _Worker] = {}
        self.retired: dict[str, Any] = {}
        self._server: asyncio.Server | None = None
        self._next = 0
        self.answered = 0  # workers counted in the last collect

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._accept, self.path)
        os.chmod(self.path, 0o600)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for worker in list(self.live.values()):
            worker.writer.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            hello = await asyncio.wait_for(_read_frame(reader), HELLO_TIMEOUT_S)
        except (TimeoutError, ValueError, ConnectionError, asyncio.IncompleteReadError):
            writer.close()
            return
        worker = _Worker(int(hello.get("pid", 0)) if isinstance(hello, dict) else 0, writer)
        self._next += 1
        ident = self._next
        self.live[ident] = worker
        try:
            while True:
                frame = await _read_frame(reader)
                if isinstance(frame, dict):
                    worker.latest = frame
                    if worker.waiter is not None and not worker.waiter.done():
                        worker.waiter.set_result(frame)
        except (ValueError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            del self.live[ident]
            self._retire(worker)
            if worker.waiter is not None and not worker.waiter.done():
                worker.waiter.set_result(None)
            writer.close()

    def _retire(self, worker: _Worker) -> None:
        if not worker.latest:
            return
        for name, provider in PROVIDERS.items():
            if name not in worker.latest:
                continue
            kept = provider.retire(worker.latest[name])
            self.retired[name] = provider.merge([self.retired[name], kept] if name in self.retired else [kept])

    async def collect(self) -> dict[str, Any]:
        """The node's data: every live worker's fresh snapshot, merged with the retired totals."""
        workers = list(self.live.items())
        answers = await asyncio.gather(*(self._ask(worker) for _, worker in workers))
        # A worker that left during the gather is in ``retired`` now: count it there only.
        snaps = [answer for (ident, _), answer in zip(workers, answers, strict=True) if answer and ident in self.live]
        self.answered = len(snaps)
        snaps.append(self.retired)
        return merged(snaps)

    async def _ask(self, worker: _Worker) -> dict[str, Any] | None:
        if worker.waiter is None or worker.waiter.done():
            worker.waiter = asyncio.get_running_loop().create_future()
            try:
                worker.writer.write(ASK)
            except (ConnectionError, RuntimeError):
                return worker.latest
        try:
            return await asyncio.wait_for(asyncio.shield(worker.waiter), ASK_TIMEOUT_S)
        except TimeoutError:
            return worker.latest
