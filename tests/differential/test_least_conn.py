"""``least_conn`` and unix-socket servers against the nginx binary: the same script of requests held
open and let go, sent to nginx and to the gateway (started through its CLI) in front of the same
backends, must land on the same servers in the same order.

The backends are upstream doubles, three on TCP ports and one on a Unix-domain socket, with
weights and a ``down`` server. A request ``/echo?hold=ID`` stays at its backend until the script
lets it go, so the picks are deterministic: each one depends only on which requests are still
held (their connection counts) and on the round-robin state among ties. Both sides run one
worker (the counts are per worker in both).

The unix-socket upstream is also compared on its own: ``proxy_pass http://unix:/path:/`` in nginx
and ``servers: [unix:/path]`` in the gateway give the same answers, the same ``$upstream_addr``
(``unix:/path``) and the same ``Host: localhost`` for an HTTP/1.0 request without one.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gateway.config.upstreams import ServerSpec
from gateway.proxy.balancer import Balancer
from tests.support.gateway import Gateway
from tests.support.nginx import NginxProcess, find_nginx, single_worker_conf
from tests.support.ports import free_port
from tests.support.upstreams import Upstream

NGINX = find_nginx()
pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed")

WEIGHTS = [1, 2, 1, 3, 1]
DOWN = [False, False, False, False, True]
SOCKET_INDEX = 3  # the server on a Unix-domain socket
STEPS = 70
MAX_HELD = 9
WAIT_S = 10.0


@dataclass
class Backends:
    ups: list[Upstream]
    arrived: dict[str, str] = field(default_factory=dict)  # hold id -> server name
    release: dict[str, threading.Event] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [up.address for up in self.ups]


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backends]:
    workdir = tmp_path_factory.mktemp("least-conn")
    ups = [
        Upstream(f"s{i}", unix_path=str(workdir / f"s{i}.sock") if i == SOCKET_INDEX else None)
        for i in range(len(WEIGHTS))
    ]
    found = Backends(ups)

    def hook_for(name: str):  # type: ignore[no-untyped-def]
        async def hold(request: web.Request) -> None:
            hold_id = request.query.get("hold")
            if not hold_id:
                return
            event = found.release.setdefault(hold_id, threading.Event())
            found.arrived[hold_id] = name
            deadline = time.monotonic() + 60
            while not event.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.005)

        return hold

    for up in ups:
        up.hooks["echo"] = hook_for(up.name)
        up.start()
    yield found
    for event in found.release.values():
        event.set()
    for up in ups:
        up.stop()


def upstream_lines(backends: Backends) -> str:
    lines = []
    for name, weight, down in zip(backends.names, WEIGHTS, DOWN, strict=True):
        lines.append(f"        server {name} weight={weight}{' down' if down else ''};")
    return "\n".join(lines)


def nginx_conf(workdir: Path, backends: Backends, port: int, unix_port: int) -> str:
    sock = backends.ups[SOCKET_INDEX].unix_path
    return single_worker_conf(
        workdir,
        f"""    log_format picks '$upstream_addr|$status|$request_uri';
    access_log {workdir}/access.log picks;
    upstream app {{
        least_conn;
{upstream_lines(backends)}
    }}
    server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://app; }} }}
    server {{ listen 127.0.0.1:{unix_port}; location / {{ proxy_pass http://unix:{sock}:/; }} }}""",
    )


def gateway_yaml(backends: Backends, port: int, unix_port: int) -> str:
    servers = ", ".join(
        f"{{address: '{name}', weight: {weight}, down: {str(down).lower()}}}"
        for name, weight, down in zip(backends.names, WEIGHTS, DOWN, strict=True)
    )
    return f"""
listen: [127.0.0.1:{port}, 127.0.0.1:{unix_port}]
workers: 1
log: {{format: '$upstream_addr|$status|$request_uri'}}
upstreams:
  app: {{servers: [{servers}], balance: least_conn}}
  sock: {{servers: ['{backends.ups[SOCKET_INDEX].address}']}}
servers:
  - {{listen: [127.0.0.1:{port}], routes: [{{location: /, upstream: app}}]}}
  - {{listen: [127.0.0.1:{unix_port}], routes: [{{location: /, upstream: sock}}]}}
"""


def script(seed: int) -> list[tuple[str, int]]:
    """("open", k): send request k and wait until a backend holds it; ("close", k): let it go
    and wait for its response."""
    rng = random.Random(seed)
    ops: list[tuple[str, int]] = []
    held: list[int] = []
    opened = 0
    for _ in range(STEPS):
        if held and (len(held) >= MAX_HELD or rng.random() < 0.4):
            k = held.pop(rng.randrange(len(held)))
            ops.append(("close", k))
        else:
            ops.append(("open", opened))
            held.append(opened)
            opened += 1
    ops += [("close", k) for k in held]
    return ops


async def run_script(url: str, backends: Backends, tag: str, ops: list[tuple[str, int]]) -> list[str]:
    """The server each opened request landed on, in order of opening."""
    picks: list[str] = []
    tasks: dict[int, asyncio.Task[int]] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as session:

        async def one(k: int) -> int:
            async with session.get(f"{url}/echo?hold={tag}{k}") as resp:
                await resp.read()
                return resp.status

        for op, k in ops:
            hold_id = f"{tag}{k}"
            if op == "open":
                tasks[k] = asyncio.create_task(one(k))
                deadline = time.monotonic() + WAIT_S
                while hold_id not in backends.arrived:
                    assert time.monotonic() < deadline, f"request {hold_id} reached no backend"
                    await asyncio.sleep(0.005)
                picks.append(backends.arrived[hold_id])
            else:
                backends.release.setdefault(hold_id, threading.Event()).set()
                assert await asyncio.wait_for(tasks.pop(k), WAIT_S) == 200
    return picks


@pytest.fixture(scope="module")
def fronts(backends: Backends, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NginxProcess, Gateway]]:
    assert NGINX is not None
    nginx_dir, gateway_dir = tmp_path_factory.mktemp("lc-nginx"), tmp_path_factory.mktemp("lc-gateway")
    n_port, n_unix, g_port, g_unix = free_port(), free_port(), free_port(), free_port()
    nginx = NginxProcess(NGINX, nginx_dir, nginx_conf(nginx_dir, backends, n_port, n_unix), n_port).start()
    gateway = Gateway(gateway_dir, gateway_yaml(backends, g_port, g_unix), g_port).start()
    nginx.unix_port = n_unix  # type: ignore[attr-defined]
    gateway.unix_port = g_unix  # type: ignore[attr-defined]
    yield nginx, gateway
    gateway.stop()
    nginx.stop()


def last_access_line(target: NginxProcess | Gateway, ending: str) -> str:
    """The last line of the target's access log, once one ends with ``ending`` (both write it after
    the answer: nginx at once, the gateway within its 100 ms flush, later on a busy machine)."""
    deadline = time.monotonic() + 20
    while True:
        if isinstance(target, Gateway):
            lines = target.access_lines(until=lambda seen: bool(seen) and seen[-1].endswith(ending))
        else:
            path = target.workdir / "access.log"
            lines = path.read_text().splitlines() if path.exists() else []
        if (lines and lines[-1].endswith(ending)) or time.monotonic() > deadline:
            return lines[-1] if lines else ""
        time.sleep(0.02)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_least_conn_picks_what_nginx_picks(backends: Backends, fronts, seed: int) -> None:
    nginx, gateway = fronts
    ops = script(seed)
    by_nginx = await run_script(nginx.url, backends, f"n{seed}-", ops)
    by_gateway = await run_script(gateway.url, backends, f"g{seed}-", ops)
    assert by_gateway == by_nginx
    # the script does exercise least_conn: every live server is picked, the down one never, and
    # the order is not what round-robin alone would give
    assert set(by_nginx) == {f"s{i}" for i, down in enumerate(DOWN) if not down}
    assert by_nginx != round_robin(len(by_nginx))


def round_robin(n: int) -> list[str]:
    servers = [
        ServerSpec(host="127.0.0.1", port=1 + i, weight=w, down=d)
        for i, (w, d) in enumerate(zip(WEIGHTS, DOWN, strict=True))
    ]
    balancer = Balancer(servers, lambda: 0)
    return [f"s{balancer.pick(set()).index}" for _ in range(n)]  # type: ignore[union-attr]


def _http10_without_host(port: int) -> dict[str, object]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /echo/plain?x=1 HTTP/1.0\r\n\r\n")
        out = b""
        while data := sock.recv(65536):
            out += data
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"200", out
    return dict(json.loads(body))


def test_a_unix_socket_upstream_answers_as_in_nginx(backends: Backends, fronts) -> None:
    nginx, gateway = fronts
    sock = backends.ups[SOCKET_INDEX]
    seen = [_http10_without_host(target.unix_port) for target in (nginx, gateway)]
    for entry in seen:
        assert entry["server"] == sock.name and entry["path"] == "/echo/plain?x=1"
        assert [v for k, v in entry["headers"] if k == "Host"] == ["localhost"]  # nginx's $proxy_host
    expected = f"{sock.address}|200|/echo/plain?x=1"
    assert last_access_line(nginx, "/echo/plain?x=1") == last_access_line(gateway, "/echo/plain?x=1") == expected
