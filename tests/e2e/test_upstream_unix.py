"""``servers: [unix:/path]`` through the CLI-started gateway: real upstreams on Unix-domain sockets,
HTTP with keep-alive pooled per socket path, WebSocket tunnels, nginx's ``Host: localhost`` for a
request that brought none, and ``unix:/path`` in ``$upstream_addr`` and the metrics."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import WSMsgType

from tests.support.config import config
from tests.support.http import exchange, get
from tests.support.ports import free_port
from tests.support.upstreams import Upstream


@pytest.fixture
def sockets(tmp_path: Path) -> Iterator[list[Upstream]]:
    ups = [Upstream(f"s{i}", unix_path=str(tmp_path / f"s{i}.sock")).start() for i in range(2)]
    yield ups
    for up in ups:
        up.stop()


def unix_config(ups: list[Upstream], metrics: int) -> object:
    return config(
        ups,
        admin="{listen: off}",
        top=f"log: {{format: 'ua=$upstream_addr us=$upstream_status'}}\nmetrics: {{listen: 127.0.0.1:{metrics}}}",
        upstream_options="connect_timeout: 1s, read_timeout: 5s",
    )


async def test_http_keeps_one_connection_per_socket_path(gateway_factory, sockets: list[Upstream]) -> None:
    metrics = free_port()
    gw = gateway_factory(unix_config(sockets, metrics))
    async with aiohttp.ClientSession() as session:
        for i in range(8):
            reply = await get(f"{gw.url}/echo/{i}", session=session)
            assert reply.status == 200
            assert reply.json()["server"] == f"s{i % 2}"  # round-robin over the two sockets
    for up in sockets:
        assert [r["path"] for r in up.seen] == [f"/echo/{i}" for i in range(8) if f"s{i % 2}" == up.name]
        assert len({r["connection"] for r in up.seen}) == 1, up.seen  # kept alive, its own pool
    lines = gw.access_lines()
    assert lines == [f"ua={sockets[i % 2].address} us=200" for i in range(8)]
    assert sockets[0].address.startswith("unix:/")
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read().decode()
    for up in sockets:
        assert f'gateway_upstream_server_up{{server="{up.address}",upstream="app"}} 1' in text, text
        assert f'gateway_upstream_server_connections{{server="{up.address}",upstream="app"}} 0' in text


async def test_websocket_tunnels_through_a_unix_socket(gateway_factory, sockets: list[Upstream]) -> None:
    gw = gateway_factory(unix_config(sockets[:1], free_port()))
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(f"{gw.url}/ws", protocols=("chat.v1",)) as ws:
            assert ws.protocol == "chat.v1"
            await ws.send_str("hello")
            msg = await ws.receive(timeout=5)
            assert (msg.type, msg.data) == (WSMsgType.TEXT, "echo:hello")
            await ws.send_bytes(b"abc")
            assert (await ws.receive(timeout=5)).data == b"cba"
    assert gw.access_lines()[-1] == f"ua={sockets[0].address} us=101"


def test_a_request_without_host_sends_localhost_as_nginx(gateway_factory, sockets: list[Upstream]) -> None:
    # nginx's $proxy_host for a unix: server is "localhost" (ngx_http_proxy_set_vars)
    gw = gateway_factory(unix_config(sockets[:1], free_port()))
    response = exchange(gw.port, b"GET /echo HTTP/1.0\r\n\r\n")
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200"), response
    assert [v for k, v in json.loads(body)["headers"] if k == "Host"] == ["localhost"]


def test_a_missing_socket_is_a_502_and_the_next_server_answers(
    gateway_factory, sockets: list[Upstream], tmp_path: Path
) -> None:
    missing = f"unix:{tmp_path / 'gone.sock'}"
    gw = gateway_factory(
        config(
            [missing, sockets[0].address],
            admin="{listen: off}",
            top="log: {format: 'ua=$upstream_addr us=$upstream_status'}",
        )
    )
    with urllib.request.urlopen(f"{gw.url}/echo", timeout=5) as resp:
        assert json.loads(resp.read())["server"] == "s0"
    assert gw.access_lines()[-1] == f"ua={missing}, {sockets[0].address} us=502, 200"
    assert re.search(r"connect\(\) failed \(2: No such file or directory\) while talking to upstream", gw.stderr())


def test_the_upstream_option_takes_a_unix_socket(gateway_factory, sockets: list[Upstream]) -> None:
    gw = gateway_factory(
        config(f"127.0.0.1:{free_port()}", admin="{listen: off}"),
        extra_args=("--upstream", f"app={sockets[1].address}"),
    )
    with urllib.request.urlopen(f"{gw.url}/echo", timeout=5) as resp:
        assert json.loads(resp.read())["server"] == "s1"
