"""What the status page's counting costs per limited request, next to the limit decision itself.

    .venv/bin/python scripts/bench_activity.py

Times ``Activity.decided`` for a passed request of a route with one limit_req zone, against
``MemoryStore.decide`` for the same request (the embedded store's whole decision), three rounds.
"""

from __future__ import annotations

import timeit

from gateway.metrics.activity import Activity
from gateway.plan import load_config_text
from gateway.store.memory import MemoryStore

CONFIG = """
listen: 127.0.0.1:1
zones:
  z: {type: req, key: $binary_remote_addr, rate: 10000r/s}
upstreams:
  app: {servers: [127.0.0.1:2]}
routes:
  - {location: /, upstream: app, limit_req: [{zone: z, burst: 1000000}]}
"""


def main() -> None:
    config = load_config_text(CONFIG)
    route = config.routes[0]
    store = MemoryStore()
    store.configure(config.spec.zones)
    activity = Activity()
    req_keys: list[bytes] = [b"\xc0\x00\x02\x01"]
    n = 200_000
    for round_ in range(3):
        empty = timeit.timeit(lambda: None, number=n) / n * 1e9
        decide = timeit.timeit(lambda: store.decide(route, req_keys, [], [], []), number=n) / n * 1e9 - empty
        count = (
            timeit.timeit(lambda: activity.decided(route, None, "", req_keys, [], [], [], None), number=n) / n * 1e9
            - empty
        )
        print(f"round {round_}: MemoryStore.decide {decide:.0f} ns, Activity.decided {count:.0f} ns")


if __name__ == "__main__":
    main()
