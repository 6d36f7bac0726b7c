"""Regenerate docs/status-page.png: the status page with realistic data, in headless Chromium.

    .venv/bin/python scripts/screenshot_status.py [--seconds 120] [--out docs/status-page.png]

Starts an upstream and the gateway (through its CLI) with four zones behind real_ip, sends
traffic for ``--seconds`` from a dozen clients (X-Forwarded-For), with an attack on /login
and a scraper on /api/ ramping up half-way, adds two bans with ``gateway ban``, then opens
the page in Debian's ``chromium`` over the DevTools protocol and saves a PNG. One server of
the ``app`` upstream is a closed port, so the page shows it DOWN. Needs the chromium binary.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
from cdp import Browser, find_chromium

ROOT = Path(__file__).resolve().parent.parent

TOKEN = "screenshot-token"


def config(upstream: str, port: int, admin: int, dead: int) -> str:
    return f"""
listen: 127.0.0.1:{port}
admin: {{listen: 127.0.0.1:{admin}, token: {TOKEN}}}
real_ip: {{from: [127.0.0.1/32], header: X-Forwarded-For}}
log: {{level: error, access: off}}
zones:
  api_per_ip: {{type: req, key: $binary_remote_addr, rate: 8r/s}}
  login: {{type: req, key: $binary_remote_addr, rate: 10r/m}}
  search: {{type: req, key: $binary_remote_addr, rate: 4r/s}}
  api_keys: {{type: count, key: $http_x_api_key, limit: 20, window: 1m}}
upstreams:
  app: {{servers: [{upstream}, {{address: 127.0.0.1:{dead}, max_fails: 1, fail_timeout: 30s}}]}}
  static: {{servers: [{upstream}]}}
routes:
  - {{location: /login, upstream: app, limit_req: [{{zone: login, burst: 5, nodelay: true}}]}}
  - {{location: /search, upstream: app, limit_req: [{{zone: search, burst: 8}}]}}
  - {{location: /api/, upstream: app, limit_req: [{{zone: api_per_ip, burst: 20, nodelay: true}}],
     limit_count: [{{zone: api_keys}}]}}
  - {{location: /, upstream: static}}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listening on {port} after {timeout}s")


def gateway(*args: str) -> list[str]:
    return [sys.executable, "-m", "gateway", *args]


@contextlib.contextmanager
def running(cmd: list[str], port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``cmd`` as a child process (its output in ``log``) until the block ends."""
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_port(port, proc)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def client(session: aiohttp.ClientSession, url: str, ip: str, paths: list[str], rate: object, end: float) -> None:
    """Requests from one address; ``rate(t)`` is its rate in requests/s at t seconds in."""
    start = time.monotonic()
    rng = random.Random(ip)
    while (now := time.monotonic()) < end:
        per_s = rate(now - start)  # type: ignore[operator]
        if per_s <= 0:
            await asyncio.sleep(0.5)
            continue
        path = rng.choice(paths)
        headers = {"X-Forwarded-For": ip}
        if path.startswith("/api/"):
            headers["X-Api-Key"] = "partner-" + ip.rsplit(".", 1)[-1]
        try:
            async with session.get(url + path, headers=headers) as resp:
                await resp.read()
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(rng.expovariate(per_s))


async def traffic(url: str, seconds: float) -> None:
    end = time.monotonic() + seconds
    half = seconds / 2
    normal = [f"198.51.100.{i}" for i in range(10, 20)]
    jobs = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        for ip in normal:
            jobs.append(client(session, url, ip, ["/", "/search", "/api/items", "/login"], lambda t: 2.0, end))
        # a scraper on the API, ramping up half-way through
        jobs.append(
            client(session, url, "203.0.113.7", ["/api/items", "/api/users"], lambda t: 2 if t < half else 30, end)
        )
        jobs.append(client(session, url, "203.0.113.8", ["/search"], lambda t: 0 if t < half / 2 else 9, end))
        # credential stuffing on /login from a few addresses
        for ip in ("192.0.2.44", "192.0.2.45", "2001:db8:bad::17"):
            jobs.append(client(session, url, ip, ["/login"], lambda t: 0 if t < half else 6, end))
        await asyncio.gather(*jobs)


async def shoot(admin: int, out: Path) -> None:
    binary = find_chromium()
    if binary is None:
        raise SystemExit("no chromium binary: apt-get install chromium")
    browser = await Browser(binary, width=1440, height=1000).start()
    try:
        await browser.navigate(f"http://127.0.0.1:{admin}/")
        await browser.evaluate(
            f"document.getElementById('token').value = {TOKEN!r};document.getElementById('login').requestSubmit(); true"
        )
        await browser.wait_for("document.querySelectorAll('.zone').length >= 3")
        await browser.wait_for("document.querySelectorAll('#bans tr[data-target]').length >= 2")
        await asyncio.sleep(2.5)  # one more refresh, so "live" is current
        problems = browser.problems()
        if problems:
            raise SystemExit(f"the browser reported problems: {problems}")
        await browser.screenshot(out)
    finally:
        await browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="how long to send traffic (default 120)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "status-page.png")
    args = parser.parse_args()
    up_port, port, admin, dead = free_port(), free_port(), free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="gateway-shot-") as tmp:
        conf = Path(tmp) / "limits.yaml"
        conf.write_text(config(f"127.0.0.1:{up_port}", port, admin, dead))
        upstream_cmd = gateway("demo-upstream", "--listen", f"127.0.0.1:{up_port}")
        with (
            running(upstream_cmd, up_port, Path(tmp) / "upstream.log"),
            running(gateway("run", "-c", str(conf)), port, Path(tmp) / "gateway.log"),
        ):
            for target, duration, reason in (
                ("192.0.2.0/24", "6h", "abuse report #4411 (botnet range)"),
                ("198.51.100.23", "30m", "credential stuffing on /login"),
            ):
                done = subprocess.run(
                    gateway("ban", target, "--for", duration, "--reason", reason, "-c", str(conf)),
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                )
                if done.returncode != 0:
                    raise SystemExit(done.stderr)
            asyncio.run(traffic(url, args.seconds))

            async def finish() -> None:
                # keep a trickle going while the browser looks, so the newest bucket is not empty
                trickle = asyncio.create_task(traffic(url, 8))
                await shoot(admin, args.out)
                await trickle

            asyncio.run(finish())
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
