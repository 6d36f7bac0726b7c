"""Instructions per proxied request, counted by valgrind's callgrind: repeatable on a noisy machine.

    .venv/bin/python scripts/bench_instructions.py [--requests 300] [--targets baseline,gateway,...]

Each target runs under ``valgrind --tool=callgrind`` twice, serving N and 2N
keep-alive requests from one client; the difference divided by N is the cost of
one request without start-up and shutdown. The upstream is nginx ``return 200``
(or an aiohttp app) outside valgrind. Throughput figures come from bench.py;
these counts say where changes move the per-request cost.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import PY, ROOT, TARGETS, Lab, free_port, wait_port


async def drive(port: int, n: int) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            async with session.get(f"http://127.0.0.1:{port}/bench") as resp:
                await resp.read()
                assert resp.status == 200, resp.status


def instructions(cmd: list[str], port: int, n: int, tmp: Path) -> int:
    out = tmp / f"callgrind.{time.monotonic_ns()}"
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *cmd],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port, timeout=900)  # valgrind starts slowly on a loaded machine
    asyncio.run(drive(port, n))
    proc.send_signal(signal.SIGINT if "baseline" in " ".join(cmd) else signal.SIGTERM)
    proc.wait(900)
    text = out.read_text(errors="replace")
    match = re.search(r"^summary:\s+(\d+)", text, re.M) or re.search(r"^totals:\s+(\d+)", text, re.M)
    assert match, "no callgrind summary"
    return int(match.group(1))


def command(lab: Lab, name: str) -> tuple[list[str], int]:
    """The command line of one of bench.py's targets (the bare proxy or a gateway config), and
    the port it will listen on; Redis, when the target uses it, is started here."""
    port = free_port()
    if name == "baseline":
        return [PY, str(ROOT / "scripts" / "baseline_proxy.py"), str(port), f"127.0.0.1:{lab.upstream()}"], port
    gw = TARGETS[name].gw
    if gw is None or gw.workers != 1:
        raise SystemExit(f"{name}: not a one-process gateway target")
    redis_port = lab.redis().port if gw.redis else 0
    conf = lab.tmp / f"{name}.yaml"
    conf.write_text(gw.config(port, lab.upstream(), redis_port, 0, lab.tmp / f"{name}.error.log"))
    return [PY, "-m", "gateway", "run", "-c", str(conf)], port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--targets", default="baseline,gateway,gateway+log,gateway+req")
    args = parser.parse_args()
    if not shutil.which("valgrind"):
        raise SystemExit("valgrind is not installed")
    targets = args.targets.split(",")
    results = {}
    with Lab() as lab:
        for name in targets:
            cmd, port = command(lab, name)
            n = args.requests
            small = instructions(cmd, port, n, lab.tmp)
            large = instructions(cmd, port, 2 * n, lab.tmp)
            results[name] = (large - small) / n
            print(f"{name:<20} {results[name] / 1000:10.1f} k instructions/request", flush=True)
        base = results.get(targets[0])
        if base:
            print(f"\nupstream: {lab.upstream_kind}; ratios to {targets[0]} (lower is cheaper):")
            for name, value in results.items():
                print(f"{name:<20} {value / base:6.2f}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
