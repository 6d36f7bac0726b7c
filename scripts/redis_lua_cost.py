#!/usr/bin/env python3
"""What the Lua of batch.lua spends per request, by kind of limit (Redis-side µs).

Starts its own redis-server on a free loopback port and calls batch.lua with batches
of ``--batch`` requests, ``--rounds`` times per case, then reads the script's time
from ``INFO commandstats`` (usec of EVALSHA, which includes the commands it runs):

    .venv/bin/python scripts/redis_lua_cost.py [--batch 50] [--rounds 200] [--keys 20]

Cases: limit_req alone (JSON state), limit_conn alone (lease taken, then released in
a later batch, as the gateway does), both; each with ``--keys`` distinct clients.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import free_port

from gateway.store import lua

LEASE_MS = 30_000


def request_op(kind: str, i: int, now: int, member: str) -> tuple[list[str], list[object]]:
    keys: list[str] = []
    n_req = n_conn = 0
    params: list[object] = []
    if "req" in kind:
        keys.append(f"req:k{i}")
        n_req = 1
        params += [100_000_000, 100_000_000_000, 0, 0]  # rate_m, burst_m, delay_m, ban_s
    if "conn" in kind:
        keys.append(f"{{t{i}}}conn:k{i}")
        n_conn = 1
        params += [60_000]
    args: list[object] = [now, member, "", 0, n_req, 0, n_conn, 1, LEASE_MS, 0, *params]
    return keys, args


def run_case(client: redis.Redis, sha: str, kind: str, batch: int, rounds: int, nkeys: int) -> dict[str, float]:
    before = client.info("commandstats").get("cmdstat_evalsha", {"calls": 0, "usec": 0})
    seq = 0
    held: list[tuple[str, str]] = []
    requests = 0
    for _ in range(rounds):
        now = int(time.time() * 1000)
        keys: list[str] = []
        args: list[object] = []
        plans: dict[tuple[object, ...], int] = {}  # each route's fixed arguments once per call
        ops = 0
        for key, member in held:  # last batch's releases ride in this one
            keys.append(key)
            args += ["x", 1, 1, member]
            ops += 1
        held = []
        for j in range(batch):
            seq += 1
            member = f"node:1:{seq}"
            i = j % nkeys
            op_keys, op_args = request_op(kind, i, now, member)
            plan = plans.setdefault(tuple(op_args[3:]), len(plans) + 1)
            keys += op_keys
            args += ["q", len(op_keys), 4, plan, *op_args[:3]]
            ops += 1
            requests += 1
            if "conn" in kind:
                held.append((op_keys[-1], member))
        plan_args = [x for plan in plans for x in (len(plan), *plan)]
        args = [len(plans), *plan_args, *args]
        client.evalsha(sha, len(keys), *keys, ops, *args)
    after = client.info("commandstats")["cmdstat_evalsha"]
    calls = after["calls"] - before["calls"]
    usec = after["usec"] - before["usec"]
    return {"us_per_request": round(usec / requests, 2), "us_per_call": round(usec / calls, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--keys", type=int, default=20)
    args = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as work:
        server = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            cwd=work,
        )
        try:
            client = redis.Redis(port=port)
            for _ in range(100):
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.05)
            sha = client.script_load(lua.source("batch.lua"))
            results = {}
            for kind in ("req", "conn", "req+conn"):
                run_case(client, sha, kind, args.batch, 20, args.keys)  # warm up
                results[kind] = run_case(client, sha, kind, args.batch, args.rounds, args.keys)
            print(json.dumps({"batch": args.batch, "keys": args.keys, **results}))
            client.close()
        finally:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
