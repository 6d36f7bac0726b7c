"""Soak: minutes of fixed-rate traffic through limit_req + limit_count + limit_conn on Redis.

    .venv/bin/python scripts/soak.py [--minutes 5] [--rate R | --fraction 0.7] [--keys 5000]

One gateway (workers: 1, pinned to CPU 0) with three zones on a redis-server of its own (the
gateway's default Redis timeout), all keyed on the X-Key header; the upstream, Redis and the
load generator share the other CPU. Without --rate it first measures the peak with wrk (5 s,
50 connections, the same 5,000 keys) and soaks at --fraction of it. The load is open-loop
(scripts/openloop.py): requests at a fixed rate, keys in rotation, every request timed from its
scheduled send. Every 30 s it prints the gateway's RSS and open fds, Redis circuit openings so
far (lines "Redis circuit open" in the gateway's error log), the achieved rate, limited (429/503)
answers and errors; at the end, RSS after warm-up (the first minute) against the end, and totals.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

import bench
import openloop
import uvloop

KEY_HEADER = "X-Key"


def soak_config() -> bench.Gw:
    return bench.Gw(req=True, count=True, conn=True, redis=True, key="$http_x_key")


def key_requests(path: str, host: str, keys: int) -> list[bytes]:
    return [f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{KEY_HEADER}: k{i}\r\n\r\n".encode() for i in range(keys)]


def wrk_keys_script(path: Path, keys: int) -> Path:
    path.write_text(
        "local n = 0\nrequest = function()\n"
        f"  n = (n + 1) % {keys}\n"
        f'  return wrk.format(nil, nil, {{["{KEY_HEADER}"] = "k" .. n}})\nend\n'
    )
    return path


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def soak(run: bench.Running, rate: float, seconds: float, keys: int, every: float) -> None:
    host = f"127.0.0.1:{run.port}"
    gen = openloop.Generator(run.url, key_requests(run.path, host, keys), connections=64)
    pid = run.proc.pid
    started = time.monotonic()
    rows: list[tuple[float, int, int, int]] = []

    async def reporter() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            done, errors, limited = gen.window
            gen.window[:] = [0, 0, 0]
            rss, nfd, opened = bench.rss_kib(pid), fds(pid), run.circuit_openings()
            rows.append((now - started, rss, nfd, opened))
            print(
                f"{now - started:6.0f} s  RSS {rss / 1024:6.1f} MB  fds {nfd:4d}  circuit openings {opened:3d}  "
                f"rate {done / (now - last):7.0f}/s  limited {limited}  errors {errors}",
                flush=True,
            )
            last = now

    task = asyncio.get_running_loop().create_task(reporter())
    result = await gen.run(rate, seconds)
    task.cancel()
    print(f"\nload: {result.summary()}")
    warm = next((r for r in rows if r[0] >= 60), rows[0] if rows else None)
    end = bench.rss_kib(pid)
    if warm:
        print(f"RSS after warm-up ({warm[0]:.0f} s) {warm[1] / 1024:.1f} MB -> end {end / 1024:.1f} MB")
        print(f"fds after warm-up {warm[2]} -> end {fds(pid)}")
    print(
        f"Redis circuit openings in all: {run.circuit_openings()}; errors {result.errors}, "
        f"unanswered at the end {result.unanswered}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5)
    parser.add_argument("--rate", type=float, default=0, help="requests/s (default: --fraction of the peak)")
    parser.add_argument("--fraction", type=float, default=0.7)
    parser.add_argument("--keys", type=int, default=5000)
    parser.add_argument("--every", type=float, default=30, help="seconds between reports")
    args = parser.parse_args()
    with bench.Lab() as lab:
        run = bench.start_gateway(lab, "soak", soak_config())
        script = wrk_keys_script(lab.tmp / "keys.lua", args.keys)
        rate = args.rate
        if not rate:
            bench.wrk(run.url, 2, 50, script)
            peak = bench.wrk(run.url, 5, 50, script).rps
            rate = args.fraction * peak
            print(f"peak (wrk -c50, 5 s, {args.keys} keys): {peak:,.0f} req/s; soak at {args.fraction:g} of it")
        openloop.pin_self_to_load_cpus()
        print(
            f"soak: {args.minutes:g} min at {rate:,.0f} req/s, limit_req + limit_count + limit_conn on Redis, "
            f"{args.keys} keys ({KEY_HEADER}), 64 connections; gateway pid {run.proc.pid} on CPU {bench.PROXY_CPU}",
            flush=True,
        )
        with openloop.collector_off():
            uvloop.run(soak(run, rate, args.minutes * 60, args.keys, args.every))
        print(f"error log lines about Redis: {redis_lines(run.error_log)}")
        for line in first_redis_lines(run.error_log):
            print(f"  first: {line}")


def first_redis_lines(log: Path | None, count: int = 5) -> list[str]:
    """The first few error-log lines about Redis (what started a run of circuit openings)."""
    if log is None or not log.exists():
        return []
    return [line for line in log.read_text(errors="replace").splitlines() if "redis" in line.lower()][:count]


def redis_lines(log: Path | None) -> int:
    if log is None or not log.exists():
        return 0
    return sum("redis" in line.lower() for line in log.read_text(errors="replace").splitlines())


if __name__ == "__main__":
    main()
