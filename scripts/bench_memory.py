"""Bytes per key of the embedded store, measured with tracemalloc (and RSS at 1M keys).

    .venv/bin/python scripts/bench_memory.py [--keys 1000000]

Inserts distinct 4-byte keys ($binary_remote_addr of IPv4 clients) into a
limit_req zone large enough to hold them all, and reports the memory Python
allocated per key. Worst cases sit right after the dict's table doubles, so the
sweep also prints sizes just past powers of two; ENTRY_COST in
gateway/store/memory.py must be at least the largest per-key cost minus 4 bytes.
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc
from pathlib import Path

from gateway.config.units import parse_rate
from gateway.config.zones import ZoneSpec
from gateway.http.keys import parse_key
from gateway.limits import nginx_req
from gateway.store.memory import ENTRY_COST, ReqZone


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def fill(n: int) -> ReqZone:
    zone = ReqZone(
        ZoneSpec(name="m", type="req", key=parse_key("$binary_remote_addr"), size=1 << 40, rate=parse_rate("10r/s"))
    )
    now = 10**9
    for i in range(n):
        zone.insert(i.to_bytes(4, "big"), nginx_req.pack(1000, now), now)
    return zone


def measure(n: int) -> float:
    zone = ReqZone(
        ZoneSpec(name="m", type="req", key=parse_key("$binary_remote_addr"), size=1 << 40, rate=parse_rate("10r/s"))
    )
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    now = 10**9
    for i in range(n):
        zone.insert(i.to_bytes(4, "big"), nginx_req.pack(1000, now), now)
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return used / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=1_000_000)
    args = parser.parse_args()
    print(f"ENTRY_COST = {ENTRY_COST} (+ key length) is what zones account per key")
    worst = 0.0
    for n in (1000, 1400, 5500, 11000, 22000, 44000, 88000, 176000, 352000, 700000):
        per_key = measure(n)
        worst = max(worst, per_key)
        print(f"{n:>9} keys: {per_key:7.1f} bytes/key")
    per_key = measure(args.keys)
    gc.collect()
    rss_before = rss_bytes()
    zone = fill(args.keys)
    rss_after = rss_bytes()
    print(
        f"{args.keys:>9} keys: {per_key:7.1f} bytes/key (tracemalloc); "
        f"RSS grew {(rss_after - rss_before) / args.keys:.1f} bytes/key ({len(zone)} keys held)"
    )
    print(f"worst over the sweep: {worst:.1f} bytes/key")


if __name__ == "__main__":
    main()
