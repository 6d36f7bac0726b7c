"""Replay one synthetic bursty trace through every zone type; draw what each lets through.

    .venv/bin/python scripts/plot_algorithms.py [--out docs/algorithms.svg]

The trace (fixed seed, 40 s, one client): a background of ~3 requests/s, a burst
of 40 at t=8 s, 25 more straddling t=10 s (a window boundary), a steady 12/s from
18 s to 26 s, and a quiet tail. Every zone allows about 5 requests/s with room for
a burst, and the decisions come from the embedded store (the same code and
vectors as Redis) on a fake clock. A delayed request (limit_req delay, token
wait) counts when it is let through. Writes an SVG (no plotting library needed)
and prints a Markdown table of the totals.
"""

from __future__ import annotations

import argparse
import asyncio
import random
from dataclasses import dataclass
from pathlib import Path

from gateway.limits import nginx_req
from gateway.plan import load_config_text
from gateway.store.memory import MemoryStore

T0 = 10**9  # a multiple of every window: clock-aligned windows start at t = 0
SPAN_MS = 40_000
BIN_MS = 500
ZONES = {
    "req (leaky bucket)": ("{type: req, key: $arg_k, rate: 5r/s}", "{zone: z, burst: 10, nodelay: true}"),
    "count fixed": ("{type: count, key: $arg_k, limit: 50, window: 10s}", "{zone: z}"),
    "count sliding": ("{type: count, key: $arg_k, limit: 50, window: 10s, window_type: sliding}", "{zone: z}"),
    "sliding_log": ("{type: sliding_log, key: $arg_k, limit: 50, window: 10s}", "{zone: z}"),
    "gcra": ("{type: gcra, key: $arg_k, rate: 5r/s, burst: 9}", "{zone: z}"),
    "token": ("{type: token, key: $arg_k, rate: 5r/s, max_delay: 1s}", "{zone: z}"),
    "token warmup": ("{type: token, key: $arg_k, rate: 5r/s, warmup: 3s, max_delay: 1s}", "{zone: z}"),
}


def trace() -> list[int]:
    rng = random.Random(11)
    times = [int(rng.uniform(0, SPAN_MS)) for _ in range(120)]  # ~3/s background
    times += [8000 + rng.randrange(200) for _ in range(40)]
    times += [9900 + rng.randrange(200) for _ in range(25)]
    times += [18_000 + i * 1000 // 12 for i in range(8 * 12)]
    return sorted(times)


@dataclass
class Replay:
    name: str
    passed: list[int]  # when each accepted request goes through
    rejected: int


async def replay(name: str, zone: str, use: str, times: list[int]) -> Replay:
    clock = [T0]
    store = MemoryStore(clock_ms=lambda: clock[0])
    config = load_config_text(
        f"zones:\n  z: {zone}\nupstreams: {{app: {{servers: [127.0.0.1:9]}}}}\n"
        f"routes:\n  - {{location: /, upstream: app, limits: [{use}]}}\n"
    )
    store.configure(config.spec.zones)
    route = config.routes[0]
    passed: list[int] = []
    rejected = 0
    for t in times:
        clock[0] = T0 + t
        keys = [b"k"] * len(route.limit_req)
        verdict = store.decide(route, keys, [b"k"] * len(route.limit_count), [], [(b"k", 1)] * len(route.limit_algo))
        delay = 0
        ok = True
        if verdict.req is not None:
            ok = verdict.req.rc in (nginx_req.OK, nginx_req.DECLINED)
            delay = verdict.req.delay_ms
        if verdict.count_rejected >= 0 or verdict.algo_rejected >= 0:
            ok = False
        for outcome in verdict.algo:
            if outcome is not None:
                delay = max(delay, outcome.delay_ms)
        if ok:
            passed.append(t + delay)
        else:
            rejected += 1
    return Replay(name, passed, rejected)


def bins(times: list[int]) -> list[int]:
    out = [0] * (SPAN_MS // BIN_MS + 4)
    for t in times:
        out[min(t // BIN_MS, len(out) - 1)] += 1
    return out


def peak_per_second(times: list[int]) -> int:
    """The most requests let through in any 1 s window (a fixed window's double burst shows here)."""
    best, start = 0, 0
    for end in range(len(times)):
        while times[end] - times[start] >= 1000:
            start += 1
        best = max(best, end - start + 1)
    return best


def svg(times: list[int], replays: list[Replay]) -> str:
    width, panel, left, top = 900, 92, 150, 40
    n = len(bins(times))
    bar = (width - left - 20) / n
    offered = bins(times)
    scale = 70 / max(offered)
    height = top + panel * len(replays) + 40
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="22" font-size="14">Requests per {BIN_MS} ms: offered (grey) and let through '
        "(blue), one bursty trace, ~5 r/s zones</text>",
    ]
    for row, rep in enumerate(replays):
        base = top + panel * row + 80
        parts.append(f'<text x="8" y="{base - 30}">{rep.name}</text>')
        summary = f"{len(rep.passed)} passed, {rep.rejected} rejected"
        parts.append(f'<text x="8" y="{base - 14}" fill="#666">{summary}</text>')
        parts.append(f'<line x1="{left}" y1="{base}" x2="{width - 20}" y2="{base}" stroke="#999"/>')
        for i, (o, p) in enumerate(zip(offered, bins(rep.passed), strict=True)):
            x = left + i * bar
            parts.append(f'<rect x="{x:.1f}" y="{base - o * scale:.1f}" width="{bar - 1:.1f}" '
                         f'height="{o * scale:.1f}" fill="#ddd"/>')  # fmt: skip
            if p:
                parts.append(f'<rect x="{x:.1f}" y="{base - p * scale:.1f}" width="{bar - 1:.1f}" '
                             f'height="{p * scale:.1f}" fill="#2a6fdb"/>')  # fmt: skip
    axis = top + panel * len(replays) + 12
    for s in range(0, SPAN_MS // 1000 + 1, 5):
        x = left + s * 1000 / BIN_MS * bar
        parts.append(f'<text x="{x:.1f}" y="{axis + 6}" text-anchor="middle">{s} s</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def table(times: list[int], replays: list[Replay]) -> str:
    rows = ["| zone | passed | rejected | most in any 1 s |", "|---|---:|---:|---:|"]
    rows.append(f"| (offered) | {len(times)} | | {peak_per_second(times)} |")
    for rep in replays:
        rows.append(f"| {rep.name} | {len(rep.passed)} | {rep.rejected} | {peak_per_second(sorted(rep.passed))} |")
    return "\n".join(rows)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "docs" / "algorithms.svg"))
    args = parser.parse_args()
    times = trace()
    replays = [await replay(name, zone, use, times) for name, (zone, use) in ZONES.items()]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(svg(times, replays), encoding="utf-8")
    print(table(times, replays))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    asyncio.run(main())
