"""CPU of the Redis store alone, per decision, with many requests in flight: no HTTP, no proxy.

    .venv/bin/python scripts/bench_store.py [--rounds 3] [--seconds 3] [--inflight 50]
    .venv/bin/python scripts/bench_store.py --tree ../old-checkout        # A/B: the same run on another tree

Each run is a child process pinned to CPU 0 (a redis-server of its own on the other CPUs)
that keeps ``--inflight`` admissions going, each ``RedisStore.admit`` of a route with
limit_req + limit_conn (the keys of one client, as bench.py's gateway+redis+conn) followed
by its release, and reports the process CPU per admission + release, and how many
operations each batch.lua call carried. With ``--tree``, rounds alternate between this
tree and that one (its ``gateway`` package first on the path), so noise hits both alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import PROXY_CPU, ROOT, Lab, pin

CHILD = """
import asyncio, sys, time
import uvloop
from gateway.plan import load_config_text
from gateway.config.store import RedisSpec
from gateway.store.redis import RedisStore

CONFIG = '''
zones:
  ip: {type: req, key: $remote_addr, rate: 1000000r/s}
  c: {type: conn, key: $remote_addr}
upstreams:
  app: {servers: [127.0.0.1:9]}
routes:
  - location: /
    upstream: app
    limit_req: [{zone: ip, burst: 1000000, nodelay: true}]
    limit_conn: [{zone: c, max: 60000}]
'''

async def main(port, seconds, inflight):
    config = load_config_text(CONFIG)
    route = config.routes[0]
    store = RedisStore(RedisSpec(url=f"redis://127.0.0.1:{port}", timeout_ms=1000, on_error="deny"))
    store.configure(config.spec.zones)
    await store.start()
    keys = [b"127.0.0.1"]

    async def one():
        verdict = await store.admit(route, keys, [], keys)
        store.release(route, verdict.conn)

    for _ in range(50):  # warm-up
        await asyncio.gather(*[one() for _ in range(inflight)])
    batches, ops = store.batcher.batches, store.batcher.operations
    done, cpu, wall = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - wall < seconds:
        await asyncio.gather(*[one() for _ in range(inflight)])
        done += inflight
    cpu = time.process_time() - cpu
    per_batch = (store.batcher.operations - ops) / max(1, store.batcher.batches - batches)
    print(f"{cpu / done * 1e6:.2f} {per_batch:.1f}")
    await store.close()

uvloop.run(main(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])))
"""


def run(tree: Path, port: int, seconds: float, inflight: int) -> tuple[float, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = pin(PROXY_CPU) + [sys.executable, "-c", CHILD, str(port), str(seconds), str(inflight)]
    out = subprocess.run(cmd, env=env, cwd=tree, check=True, capture_output=True, text=True).stdout.split()
    return float(out[0]), float(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--inflight", type=int, default=50)
    parser.add_argument("--tree", type=Path, help="another checkout to compare with (its gateway/ package)")
    args = parser.parse_args()
    trees = {"this tree": ROOT}
    if args.tree is not None:
        trees[str(args.tree)] = args.tree.resolve()
    results: dict[str, list[float]] = {name: [] for name in trees}
    with Lab() as lab:
        redis = lab.redis()
        for i in range(args.rounds):
            line = []
            for name, tree in trees.items():
                us, per_batch = run(tree, redis.port, args.seconds, args.inflight)
                results[name].append(us)
                line.append(f"{name} {us:.1f} µs ({per_batch:.0f} ops/batch)")
            print(f"round {i + 1}: " + " | ".join(line), flush=True)
    print("\nmedian CPU per admission + release (limit_req + limit_conn on Redis):")
    for name, values in results.items():
        print(f"  {name}: {statistics.median(values):.1f} µs")
    if args.tree is not None:
        this, other = (statistics.median(v) for v in results.values())
        print(f"  this tree / {args.tree} = {this / other:.2f}")


if __name__ == "__main__":
    main()
