"""What one scrape of /metrics costs: the master asks every worker, merges, renders.

    .venv/bin/python scripts/bench_scrape.py [--workers 2] [--routes 50] [--scrapes 200]

Starts the gateway with ``workers`` workers and ``routes`` routes (each with its own
limit_req zone), sends requests to every route so that every series exists (several
statuses per route), then scrapes the admin listener ``scrapes`` times, one after the
other, and prints the median and p95 latency of a scrape and the size of the text.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import PY, ROOT, Lab, free_port, wait_port

TOKEN = "bench-token"


def config(port: int, admin: int, upstream: int, workers: int, routes: int) -> str:
    text = f"""
listen: 127.0.0.1:{port}
workers: {workers}
admin: {{listen: 127.0.0.1:{admin}, token: {TOKEN}}}
log: {{access: "off"}}
upstreams:
  app: {{servers: [127.0.0.1:{upstream}], keepalive: 32}}
zones:
"""
    text += "".join(f"  z{i}: {{type: req, key: $binary_remote_addr, rate: 5r/s}}\n" for i in range(routes))
    text += "routes:\n"
    text += "".join(f"  - {{location: /r{i}, upstream: app, limit_req: [{{zone: z{i}, burst: 2, nodelay: true}}]}}\n"
                    for i in range(routes))  # fmt: skip
    return text


async def traffic(port: int, routes: int) -> None:
    for _ in range(4):  # 3 pass, then 503s: two statuses per route
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            for i in range(routes):
                async with session.get(f"http://127.0.0.1:{port}/r{i}") as resp:
                    await resp.read()


async def scrapes(admin: int, n: int) -> tuple[list[float], int]:
    times = []
    size = 0
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            started = time.perf_counter()
            async with session.get(f"http://127.0.0.1:{admin}/metrics", headers=headers) as resp:
                body = await resp.read()
                assert resp.status == 200, body
            times.append(time.perf_counter() - started)
            size = len(body)
    return times, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--routes", type=int, default=50)
    parser.add_argument("--scrapes", type=int, default=200)
    args = parser.parse_args()
    with Lab() as lab:
        port, admin = free_port(), free_port()
        conf = lab.tmp / "limits.yaml"
        conf.write_text(config(port, admin, lab.upstream(), args.workers, args.routes))
        proc = subprocess.Popen([PY, "-m", "gateway", "run", "-c", str(conf)], cwd=ROOT, stderr=subprocess.DEVNULL)
        try:
            wait_port(port)
            wait_port(admin)
            time.sleep(1.0)  # every worker up
            asyncio.run(traffic(port, args.routes))
            asyncio.run(scrapes(admin, 10))  # warm-up
            times, size = asyncio.run(scrapes(admin, args.scrapes))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    times.sort()
    print(
        f"workers={args.workers} routes={args.routes}: scrape median {statistics.median(times) * 1000:.2f} ms, "
        f"p95 {times[int(len(times) * 0.95)] * 1000:.2f} ms, {size} bytes"
    )


if __name__ == "__main__":
    main()
