"""Throughput of the gateway against a bare aiohttp proxy, measured side by side with wrk.

    .venv/bin/python scripts/bench.py [--duration 5] [--rounds 3] [--connections 64]

Every target proxies to the same fast upstream (nginx `return 200` when nginx is
installed, else an aiohttp app). Rounds alternate between targets so that noise
on a shared machine hits them alike; the script prints each round, the median
requests/s of each target and its ratio to the baseline. With two or more CPUs
the proxies run on CPU 0 and wrk plus the upstream on the others (taskset).

Targets:
  baseline      scripts/baseline_proxy.py (aiohttp + uvloop, nothing else)
  gateway       the gateway, one worker, no limits (only routing, logging off)
  gateway+log   the same with the access log on (combined format, to /dev/null)
  gateway+req   one limit_req zone (embedded store) that never rejects
  gateway+redis the same zone on a Redis store (a redis-server started for the run)
  gateway+bans  "gateway" with 100,000 manual bans loaded (IPv4 /32, /24, /16; IPv6 /128, /64),
                through the admin API with `gateway ban --file`; wrk's address is not banned,
                so every request walks the ban table (one dict probe per prefix length present)

    .venv/bin/python scripts/bench.py --targets gateway,gateway+bans   # the bans' cost, side by side
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listening on {port}")


def pin(cpus: str) -> list[str]:
    return ["taskset", "-c", cpus] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []


def start_upstream(tmp: Path) -> tuple[subprocess.Popen, int, str]:
    port = free_port()
    others = f"1-{(os.cpu_count() or 2) - 1}"
    if shutil.which("nginx"):
        (tmp / "nginx").mkdir()
        conf = tmp / "nginx" / "nginx.conf"
        conf.write_text(f"""
worker_processes 1; daemon off; pid {tmp}/nginx/nginx.pid; error_log stderr error;
events {{ worker_connections 4096; }}
http {{ access_log off; client_body_temp_path {tmp}/nginx; proxy_temp_path {tmp}/nginx;
  fastcgi_temp_path {tmp}/nginx; uwsgi_temp_path {tmp}/nginx; scgi_temp_path {tmp}/nginx;
  keepalive_requests 1000000;
  server {{ listen 127.0.0.1:{port}; location / {{ return 200 "ok\\n"; }} }} }}
""")
        proc = subprocess.Popen(pin(others) + ["nginx", "-p", str(tmp / "nginx"), "-c", str(conf), "-e", "stderr"])
        kind = "nginx return 200"
    else:
        code = (
            "import sys,uvloop;from aiohttp import web;app=web.Application();"
            "app.router.add_get('/{t:.*}',lambda r: web.Response(text='ok\\n'));"
            "web.run_app(app,port=int(sys.argv[1]),access_log=None,print=None,loop=uvloop.new_event_loop())"
        )
        proc = subprocess.Popen(pin(others) + [PY, "-c", code, str(port)])
        kind = "aiohttp hello"
    wait_port(port)
    return proc, port, kind


BAN_TOKEN = "bench-token-0123456789"


def gateway_config(
    port: int, upstream: int, *, log: bool, limit: bool, redis_port: int = 0, admin_port: int = 0
) -> str:
    admin = f"{{listen: 127.0.0.1:{admin_port}, token: {BAN_TOKEN}}}" if admin_port else "{listen: off}"
    text = f"""
listen: 127.0.0.1:{port}
workers: 1
admin: {admin}
log: {{access: {"/dev/null" if log else "off"}, format: combined}}
upstreams:
  app: {{servers: [127.0.0.1:{upstream}], keepalive: 128}}
"""
    if redis_port:
        text += f'store:\n  redis: {{url: "redis://127.0.0.1:{redis_port}/0", timeout: 200ms}}\n'
    if limit:
        text += "zones:\n  bench: {type: req, key: $binary_remote_addr, rate: 1000000r/s}\n"
    text += "routes:\n  - location: /\n    upstream: app\n"
    if limit:
        text += "    limit_req: [{zone: bench, burst: 1000000, nodelay: true}]\n"
    return text


def start_redis(tmp: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    others = f"1-{(os.cpu_count() or 2) - 1}"
    proc = subprocess.Popen(
        pin(others)
        + [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp),
        ],
        stdout=subprocess.DEVNULL,
    )
    wait_port(port)
    return proc, port


def blocklist(path: Path, count: int = 100_000) -> Path:
    """``count`` distinct CIDRs, none covering 127.0.0.0/8 (wrk's address)."""
    rng = random.Random(13)
    kinds = ((32, 40), (24, 20), (16, 5), (128, 20), (64, 15))  # prefix length, share in %
    out: dict[str, None] = {}
    for plen, share in kinds:
        goal = len(out) + count * share // 100
        while len(out) < goal:
            if plen <= 32:
                first = rng.choice([n for n in range(11, 224) if n != 127])
                value = ((first << 24) | rng.getrandbits(24)) >> (32 - plen) << (32 - plen)
                out[f"{ipaddress.IPv4Address(value)}/{plen}"] = None
            else:
                value = ((0x20010DB8 << 96) | rng.getrandbits(96)) >> (128 - plen) << (128 - plen)
                out[f"{ipaddress.IPv6Address(value)}/{plen}"] = None
    path.write_text("\n".join(out) + "\n")
    return path


def load_bans(conf: Path, tmp: Path) -> None:
    started = time.monotonic()
    subprocess.run(
        [PY, "-m", "gateway", "ban", "--file", str(blocklist(tmp / "blocklist.txt")), "--for", "0", "-c", str(conf)],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    print(f"gateway+bans: 100,000 bans loaded in {time.monotonic() - started:.1f} s", flush=True)


def target_command(name: str, tmp: Path, upstream: int, redis_port: int = 0) -> tuple[list[str], int]:
    """The command line that runs target ``name`` on a free port, and that port."""
    port = free_port()
    if name == "baseline":
        return [PY, str(ROOT / "scripts" / "baseline_proxy.py"), str(port), f"127.0.0.1:{upstream}"], port
    conf = tmp / f"{name}.yaml"
    conf.write_text(
        gateway_config(
            port,
            upstream,
            log=name == "gateway+log",
            limit=name in ("gateway+req", "gateway+redis"),
            redis_port=redis_port if name == "gateway+redis" else 0,
            admin_port=free_port() if name == "gateway+bans" else 0,
        )
    )
    return [PY, "-m", "gateway", "run", "-c", str(conf)], port


def start_target(name: str, tmp: Path, upstream: int, redis_port: int = 0) -> tuple[subprocess.Popen, int]:
    cmd, port = target_command(name, tmp, upstream, redis_port)
    proc = subprocess.Popen(pin("0") + cmd, cwd=ROOT, stdout=subprocess.DEVNULL)
    wait_port(port)
    if name == "gateway+bans":
        load_bans(tmp / f"{name}.yaml", tmp)
    return proc, port


def wrk(port: int, duration: int, connections: int) -> float:
    others = f"1-{(os.cpu_count() or 2) - 1}"
    out = subprocess.run(
        pin(others) + ["wrk", "-t1", f"-c{connections}", f"-d{duration}s", f"http://127.0.0.1:{port}/bench"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise SystemExit(f"wrk saw {errors.group(1)} error responses from port {port}:\n{out}")
    assert match, out
    return float(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--targets", default="baseline,gateway,gateway+log,gateway+req,gateway+redis")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    targets = args.targets.split(",")
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        upstream, up_port, kind = start_upstream(tmp)
        redis_proc, redis_port = start_redis(tmp) if "gateway+redis" in targets else (None, 0)
        procs = {}
        try:
            for name in targets:
                procs[name] = start_target(name, tmp, up_port, redis_port)
            for _proc, port in procs.values():
                wrk(port, 1, args.connections)  # warm-up
            results: dict[str, list[float]] = {name: [] for name in targets}
            print(f"upstream: {kind}; wrk -t1 -c{args.connections} -d{args.duration}s; cpus: {os.cpu_count()}")
            for rnd in range(args.rounds):
                row = []
                for name in targets:
                    rps = wrk(procs[name][1], args.duration, args.connections)
                    results[name].append(rps)
                    row.append(f"{name} {rps:,.0f}")
                print(f"round {rnd + 1}: " + " | ".join(row), flush=True)
            base = statistics.median(results[targets[0]])
            print(f"\n{'target':<14}{'median req/s':>14}{'ratio':>8}")
            for name in targets:
                med = statistics.median(results[name])
                print(f"{name:<14}{med:>14,.0f}{med / base:>8.2f}")
        finally:
            for proc, _ in procs.values():
                proc.send_signal(signal.SIGTERM)
            for proc, _ in procs.values():
                proc.wait(30)
            upstream.send_signal(signal.SIGTERM)
            upstream.wait(10)
            if redis_proc is not None:
                redis_proc.send_signal(signal.SIGTERM)
                redis_proc.wait(10)


if __name__ == "__main__":
    main()
