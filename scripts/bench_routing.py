"""Cost of one location lookup: one route against 2,000 locations, new table against the old matcher.

    .venv/bin/python scripts/bench_routing.py

The 2,000 locations have the shape of bench.py's gateway+2000 target (1,500 prefixes, every
third ``^~``; 500 regexes, half ``~* ^/static/fileN\\.``, half ``~ \\.eN$``). "old" is the
matcher LocationTable replaced (scripts/routing_reference.py keeps it as the reference), "uncached"
the new table with its decision cache off (the cost of a cache miss), "cached" the table as
the gateway runs it. The last lines time a flood of distinct URIs, which misses the cache.
"""

from __future__ import annotations

import random
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from routing_reference import ReferenceTable, large_locations

from gateway.http.routing import LocationTable, parse_location

CASES = {
    "prefix hit, no regex matches": "/svc17/x1",
    "^~ prefix hit": "/svc3/x",
    "regex hit (^ anchored)": "/static/file10.x",
    "regex hit ($ anchored, late)": "/q/a.e499",
    "only location / matches": "/nothing/here",
}


def per_call_ns(fn, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e9


def main() -> None:
    rng = random.Random(7)
    big = large_locations(rng, prefixes=1500, regexes=500)

    def make(locations, cls, **kw):
        return cls([(parse_location(loc), loc) for loc in locations], **kw)

    one_new, one_old = make(["/"], LocationTable), make(["/"], ReferenceTable)
    print(
        f"{'1 route':32s} old {per_call_ns(lambda: one_old.match('/x'), 20000):9.0f} ns   "
        f"new {per_call_ns(lambda: one_new.match('/x'), 20000):7.0f} ns"
    )
    old, uncached, cached = make(big, ReferenceTable), make(big, LocationTable, cache_size=0), make(big, LocationTable)
    for name, uri in CASES.items():
        row = [
            per_call_ns(lambda t=t, u=uri: t.match(u), n) for t, n in ((old, 200), (uncached, 20000), (cached, 20000))
        ]
        print(
            f"2,000 locations, {name:30s} old {row[0]:9.0f} ns   new uncached {row[1]:7.0f} ns"
            f"   cached {row[2]:5.0f} ns"
        )
    uris = [f"/svc{rng.randrange(1600)}/u{i}" for i in range(50_000)]
    for name, table in (("uncached", uncached), ("cached", cached)):
        started = time.perf_counter()
        for uri in uris:
            table.match(uri)
        print(
            f"flood of 50,000 distinct URIs, {name}: "
            f"{(time.perf_counter() - started) / len(uris) * 1e9:.0f} ns a lookup"
        )


if __name__ == "__main__":
    main()
