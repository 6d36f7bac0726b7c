"""Guard rules (nginx's ``if (...) { return ...; }``) and ``return 444`` through the CLI, on real
sockets: server rules answer before a route is chosen, route rules before the limits, a 444
closes the connection without a byte and is logged with 444. When the nginx binary is there,
the same guards in nginx answer every request of the table the same way."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.config import config
from tests.support.nginx import NginxProcess, find_nginx, single_worker_conf
from tests.support.ports import free_port
from tests.support.upstreams import Upstream

TOP = """shutdown_timeout: 5s
log: {format: json}
rules:
  - {if: '$request_method !~ ^(GET|HEAD|POST)$', return: 405}
  - {if: '$http_user_agent ~* "(sqlmap|nikto)"', return: 444}"""

ZONES = "  one: {type: req, key: $binary_remote_addr, rate: 1r/m}"

ROUTES = """
  - location: /admin/
    upstream: app
    rules:
      - {if: '$arg_key != "s3cret"', return: {code: 403, text: "no key"}}
  - location: /old/
    rules:
      - {if: $http_x_keep, return: {code: 200, text: kept}}
    return: {code: 301, url: "https://new.example$request_uri"}
  - location: /limited/
    upstream: app
    limit_req: [{zone: one}]
    rules:
      - {if: '$http_x_drop = yes', return: 444}
  - location: /
    upstream: app
"""

# (method, target, extra header lines, expected status or None for a closed connection)
CASES: list[tuple[str, str, str, int | None]] = [
    ("GET", "/", "", 200),
    ("DELETE", "/", "", 405),
    ("PUT", "/admin/x?key=s3cret", "", 405),  # the server's rules come first
    ("GET", "/", "User-Agent: Mozilla/5.0 sqlmap/1.7\r\n", None),
    ("GET", "/admin/x", "User-Agent: NIKTO\r\n", None),
    ("GET", "/admin/x", "", 403),
    ("GET", "/admin/x?key=wrong", "", 403),
    ("GET", "/admin/x?key=s3cret", "", 200),
    ("HEAD", "/admin/x?key=s3cret", "", 200),
    ("GET", "/old/page?a=1", "", 301),
    ("GET", "/old/page", "X-Keep: 1\r\n", 200),
    ("GET", "/old/page", "X-Keep: 0\r\n", 301),
    ("GET", "/limited/a", "X-Drop: yes\r\n", None),
    ("GET", "/limited/a", "X-Drop: yes\r\n", None),  # a rule answers before the limit: never limited
]


async def exchange(port: int, method: str, target: str, extra: str = "") -> bytes:
    """One request on its own connection; everything the server sent until it closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{method} {target} HTTP/1.1\r\nHost: site.example\r\n{extra}Connection: close\r\n\r\n".encode())
    await writer.drain()
    out = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return out


def status_of(out: bytes) -> int | None:
    return int(out.split(b" ", 2)[1]) if out else None


async def test_rules_answer_in_nginx_order_and_444_closes_with_nothing(gateway_factory, upstream):
    gw = gateway_factory(config(upstream, top=TOP, zones=ZONES, routes=ROUTES, admin="{listen: 'off'}"))
    got = []
    for method, target, extra, _ in CASES:
        got.append(status_of(await exchange(gw.port, method, target, extra)))
    assert got == [expected for *_, expected in CASES]
    out = await exchange(gw.port, "GET", "/old/page?a=1")
    assert b"\r\nLocation: https://new.example/old/page?a=1\r\n" in out
    assert (await exchange(gw.port, "GET", "/admin/")).endswith(b"no key")
    # the limit was never taken by the dropped requests: the first counted request passes
    assert status_of(await exchange(gw.port, "GET", "/limited/a")) == 200
    assert status_of(await exchange(gw.port, "GET", "/limited/a")) == 503
    lines = gw.access_json()
    assert [e["status"] for e in lines[: len(CASES)]] == [
        expected if expected is not None else 444 for *_, expected in CASES
    ]
    closed = [e for e in lines if e["status"] == 444]
    assert len(closed) == 4 and all(e["body_bytes_sent"] == 0 for e in closed)
    assert [e["route"] for e in closed] == ["", "", "/limited/", "/limited/"]
    assert "Traceback" not in gw.stderr()


async def test_444_on_a_keep_alive_connection_closes_it_after_earlier_answers(gateway_factory, upstream):
    gw = gateway_factory(config(upstream, top=TOP, zones=ZONES, routes=ROUTES, admin="{listen: 'off'}"))
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(b"GET /admin/x HTTP/1.1\r\nHost: h\r\n\r\n")
    await writer.drain()
    first = await asyncio.wait_for(reader.readuntil(b"no key"), 10)
    assert first.startswith(b"HTTP/1.1 403")
    writer.write(b"GET / HTTP/1.1\r\nHost: h\r\nUser-Agent: sqlmap\r\n\r\n")
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 10) == b""  # EOF: not one byte of a response
    writer.close()
    assert [e["status"] for e in gw.access_json()] == [403, 444]


def test_a_route_return_444_closes_too(gateway_factory):
    routes = "  - location: /\n    return: 444\n"
    gw = gateway_factory(
        config(None, top="shutdown_timeout: 5s\nlog: {format: json}", routes=routes, admin="{listen: 'off'}")
    )
    assert asyncio.run(exchange(gw.port, "GET", "/anything")) == b""
    assert [e["status"] for e in gw.access_json()] == [444]


NGINX_HTTP = """    log_format st '$status $body_bytes_sent';
    access_log {d}/access.log st;
    limit_req_zone $binary_remote_addr zone=one:1m rate=1r/m;
    server {{
        listen 127.0.0.1:{port};
        if ($request_method !~ ^(GET|HEAD|POST)$) {{ return 405; }}
        if ($http_user_agent ~* "(sqlmap|nikto)") {{ return 444; }}
        location /admin/ {{
            if ($arg_key != "s3cret") {{ return 403 "no key"; }}
            proxy_pass http://{up};
        }}
        location /old/ {{
            if ($http_x_keep) {{ return 200 "kept"; }}
            return 301 https://new.example$request_uri;
        }}
        location /limited/ {{
            limit_req zone=one;
            if ($http_x_drop = yes) {{ return 444; }}
            proxy_pass http://{up};
        }}
        location / {{ proxy_pass http://{up}; }}
    }}
"""


async def test_nginx_answers_the_same_table(tmp_path: Path, upstream: Upstream):
    binary = find_nginx()
    if binary is None:
        pytest.skip("nginx binary not found")
    port = free_port()
    conf = single_worker_conf(
        tmp_path, NGINX_HTTP.format(d=tmp_path, port=port, up=upstream.address), worker_connections=256
    )
    nginx = NginxProcess(binary, tmp_path, conf, port)
    nginx.start()
    try:
        got = [status_of(await exchange(port, m, t, x)) for m, t, x, _ in CASES]
        location = await exchange(port, "GET", "/old/page?a=1")
    finally:
        nginx.stop()
    assert got == [expected for *_, expected in CASES]
    assert b"\r\nLocation: https://new.example/old/page?a=1\r\n" in location
    logged = (tmp_path / "access.log").read_text().split("\n")
    assert [line for line in logged if line.startswith("444")] == ["444 0"] * 4
