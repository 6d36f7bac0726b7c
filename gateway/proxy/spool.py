"""Bodies the gateway holds between a slow side and a fast one, like nginx's buffers and temp files.

* ``RequestSpool``: the client's whole request body, read before an upstream
  connection is taken (``proxy_request_buffering on``): in memory up to
  ``client_body_buffer_size``, then in a temp file. It can be sent again, so a
  retry on the next server is possible after it was sent.
* ``ResponseSpool``: the upstream's response body on its way to the client
  (``proxy_buffering``): in memory up to ``proxy_buffers``, then in a temp file up
  to ``proxy_max_temp_file_size``; past that the producer (the upstream
  connection) is paused: backpressure. The producer lets go of the spool as soon
  as the response is complete, so the upstream connection is free at once,
  however slowly the client reads.

Temp files are anonymous (``O_TMPFILE``, or unlinked at creation): closing one
removes it, and nothing is left on disk whatever happens to the process.
Reads and writes are plain blocking calls, as nginx makes them without ``aio``:
they hit the page cache.
"""

from __future__ import annotations

import asyncio
import collections
import os
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

READ_BLOCK = 256 * 1024  # bytes of a request body read back from its temp file at a time
MIN_READ_BLOCK = 16 * 1024  # a response is read back from its temp file proxy_buffers at a time, at least this
UNBUFFERED_MEMORY = 256 * 1024  # proxy_buffering off: read ahead at most this much, in memory


@dataclass(frozen=True, slots=True, kw_only=True)
class BufferPolicy:
    """A route's buffering settings, compiled once per configuration."""

    request_buffering: bool = True
    client_body_buffer_size: int = 16 * 1024
    client_body_deadline_s: float = 300.0  # 0 = no deadline for the whole body
    response_buffering: bool = True
    proxy_buffers: int = 64 * 1024
    max_temp_file_size: int = 1024**3  # 0 = never spill a response to disk
    temp_path: str | None = None  # None = the system's temp dir


class TempFile:
    """An anonymous file: appended to, read at any offset, gone when closed."""

    def __init__(self, directory: str | None) -> None:
        self._file = tempfile.TemporaryFile(dir=directory, buffering=0)  # noqa: SIM115 (closed by close())
        self._fd = self._file.fileno()
        self.size = 0

    def append(self, data: bytes | memoryview) -> int:
        """Write at the end; returns the offset the data starts at."""
        offset = self.size
        view = memoryview(data)
        while view:
            written = os.pwrite(self._fd, view, self.size)
            self.size += written
            view = view[written:]
        return offset

    def read(self, offset: int, length: int) -> bytes:
        return os.pread(self._fd, length, offset)

    def rewind(self) -> None:
        """Forget the content (it was all read): the next append starts at offset 0."""
        self.size = 0

    def close(self) -> None:
        self._file.close()


class RequestSpool:
    """A whole request body, kept to be sent (and sent again on a retry)."""

    def __init__(self, memory_limit: int, temp_path: str | None) -> None:
        self.memory_limit = memory_limit
        self.temp_path = temp_path
        self.size = 0
        self._memory: list[bytes] = []
        self._file: TempFile | None = None

    @property
    def on_disk(self) -> bool:
        return self._file is not None

    def write(self, data: bytes) -> None:
        """Keep ``data``; raises OSError if the temp file cannot be created or written."""
        if self._file is None and self.size + len(data) <= self.memory_limit:
            self._memory.append(data)
        else:
            if self._file is None:
                self._file = TempFile(self.temp_path)
                for chunk in self._memory:
                    self._file.append(chunk)
                self._memory = []
            self._file.append(data)
        self.size += len(data)

    async def _chunks(self) -> AsyncIterator[bytes]:
        for chunk in self._memory:
            yield chunk
        file = self._file
        offset = 0
        while file is not None and offset < file.size:
            block = file.read(offset, min(READ_BLOCK, file.size - offset))
            if not block:
                raise OSError("request body temp file is shorter than what was written to it")
            offset += len(block)
            yield block

    def __aiter__(self) -> AsyncIterator[bytes]:
        """The body from its first byte, each time it is iterated."""
        return self._chunks()

    def close(self) -> None:
        self._memory = []
        if self._file is not None:
            self._file.close()
            self._file = None


class Producer(Protocol):
    """What a ResponseSpool asks of the connection that fills it."""

    def pause_body(self) -> None: ...

    def resume_body(self) -> None: ...

    def finish(self) -> None: ...

    def close(self) -> None: ...


class ResponseSpool:
    """One response body on its way from the upstream connection to the client.

    The connection ``feed``s it, then calls ``end`` (or ``fail``) and lets go of it;
    the writer takes ``chunks`` at the client's pace. Bytes leave in the order they
    came, from memory or from the temp file.
    """

    def __init__(
        self,
        policy: BufferPolicy,
        timeout_error: Callable[[], Exception],
        on_spill_error: Callable[[OSError, Any], None],
        owner: Any = None,
    ) -> None:
        """``on_spill_error(exc, owner)``: the temp file failed (``owner``: whose response it is,
        for the log); ``timeout_error()``: the exception a read timeout raises. Module-level
        functions both, so that a spool costs no closures."""
        self.policy = policy
        self.temp_path = policy.temp_path
        self._timeout_error = timeout_error
        self._on_spill_error = on_spill_error
        self._owner = owner
        self.memory_limit = 0
        self.file_limit = 0
        self.buffering = True
        self._read_block = MIN_READ_BLOCK
        self.set_buffering(policy.response_buffering)
        self.producer: Producer | None = None
        self.complete = False
        self.error: BaseException | None = None
        self.spilled = 0  # bytes that went through the temp file, in all
        self._segments: collections.deque[bytes | tuple[int, int]] = collections.deque()
        self._in_memory = 0
        self._in_file = 0
        self._file: TempFile | None = None
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None

    def set_buffering(self, on: bool) -> None:
        """On: read ahead into ``proxy_buffers``, then the temp file. Off: only a little,
        in memory, so a slow client holds the upstream back (the upstream's
        ``X-Accel-Buffering`` header may switch it, as in nginx)."""
        self.buffering = on
        if on:
            self.memory_limit = self.policy.proxy_buffers
            self.file_limit = self.policy.max_temp_file_size
        else:
            self.memory_limit = UNBUFFERED_MEMORY
            self.file_limit = 0
        self._read_block = max(self.memory_limit, MIN_READ_BLOCK)

    def expect_whole(self, length: int) -> None:
        """The writer will read the whole (small) body before sending it: keep it in memory."""
        self.memory_limit = max(self.memory_limit, length)

    # -- the producer's side
    def attach(self, producer: Producer) -> None:
        self.producer = producer

    def feed(self, data: bytes) -> None:
        size = len(data)
        waiting = self._waiter is not None and not self._waiter.done()
        if waiting or self._in_memory + size <= self.memory_limit or not self._spill(data):
            self._segments.append(data)
            self._in_memory += size
            if self._in_memory > self.memory_limit and not self._paused and self.producer is not None:
                self._paused = True
                self.producer.pause_body()
        self._wake()

    def end(self) -> None:
        """The whole body is in; the producer lets go."""
        self.complete = True
        self.producer = None
        self._wake()

    def fail(self, error: BaseException) -> None:
        """The body will not complete (the owner still finishes or aborts the producer)."""
        if self.error is None and not self.complete:
            self.error = error
        self._wake()

    def _spill(self, data: bytes) -> bool:
        if self.file_limit <= 0:
            return False
        if self._file is not None and self._in_file == 0:
            self._file.rewind()  # everything written was read back: start over
        used = self._file.size if self._file is not None else 0
        if used + len(data) > self.file_limit:
            return False
        try:
            if self._file is None:
                self._file = TempFile(self.temp_path)
            offset = self._file.append(data)
        except OSError as exc:
            self.file_limit = 0  # no disk for this response: backpressure from now on
            self._on_spill_error(exc, self._owner)
            return False
        self._in_file += len(data)
        self.spilled += len(data)
        last = self._segments[-1] if self._segments else None
        if isinstance(last, tuple) and last[0] + last[1] == offset:
            self._segments[-1] = (last[0], last[1] + len(data))
        else:
            self._segments.append((offset, len(data)))
        return True

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the writer's side
    def _take(self) -> bytes:
        segment = self._segments[0]
        if isinstance(segment, bytes):
            self._segments.popleft()
            self._in_memory -= len(segment)
            data = segment
        else:
            assert self._file is not None
            offset, length = segment
            # at most proxy_buffers at a time: what a slow client costs in memory stays bounded
            data = self._file.read(offset, min(length, self._read_block))
            if not data:
                raise OSError("response temp file is shorter than what was written to it")
            if len(data) == length:
                self._segments.popleft()
            else:
                self._segments[0] = (offset + len(data), length - len(data))
            self._in_file -= len(data)
        if self._paused and self._in_memory <= self.memory_limit // 2:
            self._paused = False
            if self.producer is not None:
                self.producer.resume_body()
        return data

    def whole(self) -> bytes | None:
        """The whole body at once if it is all in, in memory (the usual small response); else None."""
        if not self.complete or self.error is not None or self._file is not None:
            return None
        segments = self._segments
        data = segments[0] if len(segments) == 1 else b"".join(segments)  # type: ignore[arg-type]
        segments.clear()
        self._in_memory = 0
        return data  # type: ignore[return-value]

    async def chunks(self, read_timeout: float) -> AsyncIterator[bytes]:
        """The body's bytes as they can be had; ``read_timeout`` bounds a wait for the upstream."""
        loop = asyncio.get_running_loop()
        while True:
            if self._segments:
                yield self._take()
                continue
            if self.error is not None:
                raise self.error
            if self.complete:
                return
            self._waiter = loop.create_future()
            timer = loop.call_later(read_timeout, self._expire, self._waiter)
            try:
                await self._waiter
            finally:
                timer.cancel()
                self._waiter = None

    def _expire(self, waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            waiter.set_exception(self._timeout_error())

    @property
    def buffered(self) -> int:
        return self._in_memory + self._in_file

    # -- the owner's side
    def finish(self) -> None:
        """The exchange is over: the connection (if still held) goes back to its pool or is closed."""
        producer, self.producer = self.producer, None
        if producer is not None:
            producer.finish()

    def abort(self) -> None:
        """The exchange was abandoned: the connection (if still held) is closed."""
        producer, self.producer = self.producer, None
        if producer is not None:
            producer.close()

    def close(self) -> None:
        """Drop what is left, and the temp file."""
        self._segments.clear()
        self._in_memory = self._in_file = 0
        if self._file is not None:
            self._file.close()
            self._file = None
