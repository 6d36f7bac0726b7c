#!/usr/bin/env python3
"""What the Redis store costs Redis, per request served: script calls, commands, CPU.

Starts its own redis-server (a free loopback port), a tiny upstream and the gateway
through its CLI with ``store.redis``, loads it with ``wrk -c<connections>`` (or an
aiohttp client with as many tasks when wrk is missing), and reads ``INFO commandstats``
and ``INFO cpu`` before and after:

    .venv/bin/python scripts/redis_cost.py --limits req+conn --connections 50 --seconds 5

Prints one line of JSON: requests, req/s, top-level calls by command per request,
Redis CPU µs (user + sys) per request, and the script's usec_per_call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import ROOT, free_port, wait_port

UPSTREAM = r"""
import asyncio, sys
BODY = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"
class P(asyncio.Protocol):
    def connection_made(self, t): self.t = t; self.buf = b""
    def data_received(self, d):
        self.buf += d
        while b"\r\n\r\n" in self.buf:
            _, self.buf = self.buf.split(b"\r\n\r\n", 1)
            self.t.write(BODY)
async def main():
    server = await asyncio.get_running_loop().create_server(P, "127.0.0.1", int(sys.argv[1]))
    await server.serve_forever()
asyncio.run(main())
"""

ZONES = {
    "req": "  req: {type: req, key: $remote_addr$arg_k, rate: 100000r/s}\n",
    "conn": "  conn: {type: conn, key: $remote_addr$arg_k}\n",
}
USES = {
    "req": "limit_req: [{zone: req, burst: 100000, nodelay: true}]",
    "conn": "limit_conn: [{zone: conn, max: 10000}]",
}


def redis_cmd(port: int, *args: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as s:
        out = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a.encode()) for a in args)
        s.sendall(out)
        data = b""
        s.settimeout(2)
        while True:
            chunk = s.recv(65536)
            data += chunk
            if data.startswith(b"$"):
                size = int(data[1 : data.index(b"\r\n")])
                if len(data) >= data.index(b"\r\n") + 2 + size + 2:
                    return data[data.index(b"\r\n") + 2 : data.index(b"\r\n") + 2 + size]
            elif data.endswith(b"\r\n"):
                return data


def info(port: int) -> tuple[dict[str, tuple[int, int]], float]:
    text = redis_cmd(port, "INFO", "all").decode()
    calls: dict[str, tuple[int, int]] = {}
    for m in re.finditer(r"^cmdstat_([^:]+):calls=(\d+),usec=(\d+)", text, re.M):
        calls[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    fields = dict(re.findall(r"^(used_cpu_user|used_cpu_sys):([\d.]+)", text, re.M))
    cpu = float(fields["used_cpu_user"]) + float(fields["used_cpu_sys"])
    return calls, cpu


async def aio_load(url: str, connections: int, seconds: float) -> int:
    import aiohttp

    done = 0
    deadline = time.monotonic() + seconds

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        nonlocal done
        while time.monotonic() < deadline:
            async with session.get(f"{url}/?k={i % 8}") as response:
                await response.read()
                done += 1

    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(one(session, i) for i in range(connections)))
    return done


def load(url: str, connections: int, seconds: float) -> tuple[int, int]:
    """Requests served, and how many of them were not 2xx (503: the store was unavailable)."""
    if shutil.which("wrk"):
        out = subprocess.run(
            ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", url + "/"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        m = re.search(r"(\d+) requests in", out)
        assert m, out
        non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
        return int(m.group(1)), int(non2xx.group(1)) if non2xx else 0
    return asyncio.run(aio_load(url, connections, seconds)), 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limits", default="req+conn", help="req, conn or req+conn")
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--timeout", default="50ms", help="store.redis.timeout")
    args = parser.parse_args()
    kinds = args.limits.split("+")
    work = Path(tempfile.mkdtemp(prefix="redis-cost-"))
    rport, uport, gport = free_port(), free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(
            subprocess.Popen(
                ["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                stdout=subprocess.DEVNULL,
                cwd=work,
            )
        )
        procs.append(subprocess.Popen([sys.executable, "-c", UPSTREAM, str(uport)]))
        wait_port(rport, 15.0)
        wait_port(uport, 15.0)
        config = (
            f"listen: 127.0.0.1:{gport}\nworkers: 1\n"
            f"store:\n  redis: {{url: 'redis://127.0.0.1:{rport}/0', timeout: {args.timeout}, on_error: deny}}\n"
            "zones:\n" + "".join(ZONES[k] for k in kinds) + f"upstreams:\n  app: {{servers: [127.0.0.1:{uport}]}}\n"
            "routes:\n  - {location: /, upstream: app, " + ", ".join(USES[k] for k in kinds) + "}\n"
        )
        (work / "gw.yaml").write_text(config)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        gw = subprocess.Popen(
            [sys.executable, "-m", "gateway", "run", "-c", str(work / "gw.yaml")],
            stdout=subprocess.DEVNULL,
            stderr=open(work / "gw.err", "wb"),  # noqa: SIM115
            cwd=ROOT,
            env=env,
        )
        procs.append(gw)
        wait_port(gport, 15.0)
        url = f"http://127.0.0.1:{gport}"
        load(url, args.connections, 1.0)  # warm up: scripts loaded, connections open
        time.sleep(0.3)
        before, cpu0 = info(rport)
        started = time.monotonic()
        n, failed = load(url, args.connections, args.seconds)
        elapsed = time.monotonic() - started
        time.sleep(0.5)  # let fire-and-forget releases land
        after, cpu1 = info(rport)
        info_calls = 1  # our own INFO in `after`
        per: dict[str, float] = {}
        usec: dict[str, float] = {}
        for name, (calls, us) in after.items():
            c0, u0 = before.get(name, (0, 0))
            delta = calls - c0 - (info_calls if name == "info" else 0)
            if delta > 0:
                per[name] = round(delta / n, 4)
                usec[name] = round((us - u0) / delta, 2)
        top = sum(v for k, v in per.items() if k in ("evalsha", "eval", "zrem", "zadd", "pexpire", "ping", "get"))
        print(
            json.dumps(
                {
                    "limits": args.limits,
                    "connections": args.connections,
                    "requests": n,
                    "not_2xx": failed,
                    "req_per_s": round(n / elapsed),
                    "top_level_per_request": per,
                    "top_level_total_per_request": round(top, 4),
                    "usec_per_call": usec,
                    "redis_cpu_us_per_request": round((cpu1 - cpu0) * 1e6 / n, 1),
                    "circuit_openings": (work / "gw.err").read_text().count("Redis circuit open"),
                }
            )
        )
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
