"""An open-loop load generator: requests at a fixed rate, each timed from its scheduled send.

wrk is closed-loop: a slow response delays the next request, so queueing hides. Here request i
is due at t0 + i / rate whatever happened before; its latency is counted from that due time, so
time spent waiting (for a free connection, in the proxy's queue, in the generator) shows, as
wrk2 counts it. The generator runs on uvloop with raw keep-alive HTTP/1.1 connections and
reports its own achieved send rate and lateness, so that a saturated generator is visible.

    .venv/bin/python scripts/openloop.py URL --rate 1500 [--seconds 10] [--connections 64]
    .venv/bin/python scripts/openloop.py --compare GATEWAY_URL UPSTREAM_URL --rate 1500

With --compare it measures the bare upstream and then the gateway at the same rate and prints
the added latency (gateway minus upstream) at p50, p90, p99 and p99.9. Run it on a CPU of its
own or the load CPU (bench.py --open-loop does: it pins itself to the load CPUs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import math
import os
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import uvloop

TIMER_TICK_S = 0.001  # libuv's timer resolution


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of an ascending sequence: the smallest value with at
    least q% of the values at or below it; nan for an empty sequence."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def response_length(buf: bytes | bytearray) -> int:
    """The length of the first complete HTTP/1.1 response in ``buf`` (Content-Length framing),
    or 0 when it is not complete yet."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return 0
    head = bytes(buf[:end]).lower()
    at = head.find(b"\r\ncontent-length:")
    size = 0
    if at >= 0:
        stop = head.find(b"\r\n", at + 2)
        size = int(head[at + 17 : stop if stop >= 0 else len(head)])
    total = end + 4 + size
    return total if len(buf) >= total else 0


@dataclass
class Result:
    rate: float
    seconds: float
    scheduled: int = 0
    latencies: list[float] = field(default_factory=list)  # seconds, from the due time
    send_lag: list[float] = field(default_factory=list)  # seconds from due to the actual write
    timer_lag: list[float] = field(default_factory=list)  # seconds from due to dispatch: the generator's own lateness
    waited: int = 0  # requests that found no idle connection and queued for one
    statuses: dict[int, int] = field(default_factory=dict)
    errors: int = 0  # connections lost or refused mid-request
    unanswered: int = 0  # still waiting 10 s after the last scheduled send
    elapsed: float = 0.0

    @property
    def achieved(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0

    def ms(self, q: float, values: list[float] | None = None) -> float:
        return percentile(sorted(self.latencies if values is None else values), q) * 1000

    def summary(self) -> str:
        lag, timer = sorted(self.send_lag), sorted(self.timer_lag)
        return (
            f"asked {self.rate:,.0f}/s, achieved {self.achieved:,.0f}/s ({len(self.latencies)} of {self.scheduled}), "
            f"errors {self.errors}, unanswered {self.unanswered}, statuses {dict(sorted(self.statuses.items()))}; "
            f"latency ms p50 {self.ms(50):.2f} "
            f"p90 {self.ms(90):.2f} p99 {self.ms(99):.2f} p99.9 {self.ms(99.9):.2f} max {self.ms(100):.2f}; "
            f"send lag ms p50 {percentile(lag, 50) * 1000:.2f} p99 {percentile(lag, 99) * 1000:.2f}, "
            f"{self.waited} waited for a connection; generator lateness ms p99 {percentile(timer, 99) * 1000:.2f}"
        )


class Generator:
    """Fixed-rate requests over a pool of keep-alive connections."""

    def __init__(self, url: str, requests: Sequence[bytes] | None = None, connections: int = 64) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.requests = list(requests or [f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode()])
        self.connections = connections
        self.idle: deque[Conn] = deque()
        self.backlog: deque[tuple[float, int]] = deque()
        self.result = Result(0, 0)
        self.pending = 0
        self.done = asyncio.Event()
        self.window = [0, 0, 0]  # completions, errors, limited (429/503) since last read

    async def connect(self) -> Conn:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(lambda: Conn(self), self.host, self.port)
        return conn

    def dispatch(self, due: float, index: int) -> None:
        self.pending += 1
        self.result.timer_lag.append(time.monotonic() - due)
        if self.idle:
            self.idle.pop().send(due, self.requests[index % len(self.requests)])
        else:
            self.result.waited += 1
            self.backlog.append((due, index))

    def finished(self, conn: Conn, due: float, status: int, reusable: bool) -> None:
        self.result.latencies.append(time.monotonic() - due)
        self.result.statuses[status] = self.result.statuses.get(status, 0) + 1
        self.window[0] += 1
        if status in (429, 503):
            self.window[2] += 1
        self.pending -= 1
        if reusable:
            self.hand_out(conn)
        else:
            asyncio.get_running_loop().create_task(self.replace())
        if not self.pending:
            self.done.set()

    def failed(self, due: float) -> None:
        self.result.errors += 1
        self.window[1] += 1
        self.pending -= 1
        asyncio.get_running_loop().create_task(self.replace())
        if not self.pending:
            self.done.set()

    async def replace(self) -> None:
        """A new connection for one that closed; retried every 100 ms while connecting fails."""
        while True:
            try:
                conn = await self.connect()
                break
            except OSError:
                await asyncio.sleep(0.1)
        self.hand_out(conn)

    def hand_out(self, conn: Conn) -> None:
        if self.backlog:
            due, index = self.backlog.popleft()
            conn.send(due, self.requests[index % len(self.requests)])
        else:
            self.idle.append(conn)

    async def run(self, rate: float, seconds: float) -> Result:
        """Send ``rate * seconds`` requests on schedule; wait up to 10 s for the last answers."""
        for _ in range(self.connections):
            self.idle.append(await self.connect())
        self.result = res = Result(rate, seconds, scheduled=int(rate * seconds))
        interval = 1 / rate
        start = time.monotonic() + 0.01
        i = 0
        while i < res.scheduled:
            now = time.monotonic()
            while i < res.scheduled and start + i * interval <= now:
                self.dispatch(start + i * interval, i)
                i += 1
            if i < res.scheduled:
                # Never shorter than the loop's timer tick: libuv's timers count whole
                # milliseconds, so a shorter sleep returns at once and the generator would spin,
                # taking CPU from the upstream that shares its CPU. Requests due within a tick go
                # out together on the tick (as wrk2's millisecond timers send them), each still
                # timed from its own due time.
                await asyncio.sleep(max(TIMER_TICK_S, start + i * interval - time.monotonic()))
        self.done.clear()
        if self.pending:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), 10)
        res.unanswered = self.pending
        res.elapsed = max(time.monotonic() - start, seconds)
        for conn in list(self.idle):
            conn.close()
        return res


class Conn(asyncio.Protocol):
    def __init__(self, gen: Generator) -> None:
        self.gen = gen
        self.buf = bytearray()
        self.due = 0.0
        self.busy = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport

    def send(self, due: float, request: bytes) -> None:
        assert self.transport is not None
        if self.transport.is_closing():
            self.gen.failed(due)
            return
        self.due, self.busy = due, True
        self.gen.result.send_lag.append(time.monotonic() - due)
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        size = response_length(self.buf)
        if size and self.busy:
            status = int(self.buf[9:12])
            reusable = b"\r\nconnection: close" not in bytes(self.buf[:size]).lower()
            del self.buf[:size]
            self.busy = False
            if not reusable:
                self.close()
            self.gen.finished(self, self.due, status, reusable)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.busy:
            self.busy = False
            self.gen.failed(self.due)
        elif self in self.gen.idle:
            self.gen.idle.remove(self)
            asyncio.get_running_loop().create_task(self.gen.replace())

    def close(self) -> None:
        if self.transport is not None:
            self.busy = False
            self.transport.close()


def run(
    url: str, rate: float, seconds: float, connections: int = 64, requests: Sequence[bytes] | None = None
) -> Result:
    with collector_off():
        return uvloop.run(Generator(url, requests, connections).run(rate, seconds))


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """The generator's own garbage collector off while it generates: a full collection over its
    growing sample lists paused it for ~10 ms, which read as proxy latency."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


def pin_self_to_load_cpus() -> None:
    n = os.cpu_count() or 1
    if n > 1 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(range(1, n)))


def compare(gateway_url: str, upstream_url: str, rate: float, seconds: float = 10, connections: int = 64) -> None:
    """Upstream alone, then through the gateway, at the same rate; prints the added latency."""
    pin_self_to_load_cpus()
    print(f"\nopen loop at {rate:,.0f} requests/s for {seconds:g} s, {connections} connections, generator on CPU 1:")
    run(upstream_url, rate, 1, connections)  # warm-up
    direct = run(upstream_url, rate, seconds, connections)
    print(f"  upstream directly: {direct.summary()}")
    run(gateway_url, rate, 1, connections)
    via = run(gateway_url, rate, seconds, connections)
    print(f"  through gateway:   {via.summary()}")
    print("| rate | p50 added ms | p90 added ms | p99 added ms | p99.9 added ms | achieved | errors |")
    print("|---|---|---|---|---|---|---|")
    added = [via.ms(q) - direct.ms(q) for q in (50, 90, 99, 99.9)]
    cells = " | ".join(f"{a:.2f}" for a in added)
    print(f"| {rate:,.0f}/s | {cells} | {via.achieved:,.0f}/s | {via.errors} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", nargs="?")
    parser.add_argument("--compare", nargs=2, metavar=("GATEWAY_URL", "UPSTREAM_URL"))
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--connections", type=int, default=64)
    args = parser.parse_args()
    if args.compare:
        compare(args.compare[0], args.compare[1], args.rate, args.seconds, args.connections)
    elif args.url:
        pin_self_to_load_cpus()
        print(run(args.url, args.rate, args.seconds, args.connections).summary())
    else:
        parser.error("give a URL or --compare")


if __name__ == "__main__":
    main()
