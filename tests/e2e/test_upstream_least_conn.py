"""``balance: least_conn`` through the CLI-started gateway, against real upstreams: a slow server
gets fewer requests than a fast one, and every server's connection count
(``gateway_upstream_server_connections``) comes back to 0 after upstream errors, retries to the
next server, client aborts (before the answer and in the middle of a body), a client body cut
short and WebSocket tunnels: a count that leaked would skew least_conn for good."""

from __future__ import annotations

import asyncio
import re
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator

import aiohttp
import pytest
from aiohttp import web

from tests.support.config import config
from tests.support.http import get
from tests.support.ports import free_port
from tests.support.upstreams import ScriptUpstream, Upstream, read_request

WAIT_S = 10.0  # a count goes back as soon as the gateway sees the end; this only bounds the test


def conns(metrics_port: int) -> dict[str, float]:
    """``gateway_upstream_server_connections`` of upstream ``app``, by server."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    found = re.findall(r'gateway_upstream_server_connections\{server="([^"]+)",upstream="app"\} (\S+)', text)
    return {server: float(n) for server, n in found}


async def wait_conns(metrics_port: int, want: Callable[[dict[str, float]], bool]) -> dict[str, float]:
    deadline = time.monotonic() + WAIT_S
    while True:
        got = await asyncio.to_thread(conns, metrics_port)
        if want(got):
            return got
        assert time.monotonic() < deadline, got
        await asyncio.sleep(0.05)


def all_zero(got: dict[str, float]) -> bool:
    return bool(got) and all(n == 0 for n in got.values())


def lc_config(
    servers: list[str], metrics: int, upstream_options: str = "", route: str = "", read_timeout: str = "3s"
) -> object:
    options = f"balance: least_conn, connect_timeout: 1s, read_timeout: {read_timeout}" + (
        f", {upstream_options}" if upstream_options else ""
    )
    return config(
        servers,
        admin="{listen: off}",
        top=f"metrics: {{listen: 127.0.0.1:{metrics}}}\nshutdown_timeout: 1s",
        upstream_options=options,
        route=route,
    )


@pytest.fixture
def slow_fast() -> Iterator[tuple[Upstream, Upstream]]:
    slow, fast = Upstream("slow").start(), Upstream("fast").start()

    async def lag(_request: web.Request) -> None:
        await asyncio.sleep(0.4)

    slow.hooks["echo"] = lag
    yield slow, fast
    slow.stop()
    fast.stop()


@pytest.mark.timing
@pytest.mark.parametrize(("balance", "most_for_slow"), [("least_conn", 12), ("round_robin", 30)])
async def test_a_slow_server_gets_fewer_requests(gateway_factory, slow_fast, balance: str, most_for_slow: int) -> None:
    slow, fast = slow_fast
    metrics = free_port()
    gw = gateway_factory(
        config(
            [slow, fast],
            admin="{listen: off}",
            top=f"metrics: {{listen: 127.0.0.1:{metrics}}}",
            upstream_options=f"balance: {balance}",
        )
    )
    served: list[str] = []

    async def client(session: aiohttp.ClientSession) -> None:
        for _ in range(15):
            reply = await get(f"{gw.url}/echo", session=session)
            assert reply.status == 200
            served.append(reply.json()["server"])

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4)) as session:
        await asyncio.wait_for(asyncio.gather(*(client(session) for _ in range(4))), 60)
    assert len(served) == 60
    if balance == "round_robin":  # the contrast: round-robin ignores how busy a server is
        assert served.count("slow") == 30
    else:
        # 4 requests at a time: the slow server is picked only when it holds no more than the
        # fast one, which finishes at once; the slow one gets at most a few per 0.4 s
        assert served.count("slow") <= most_for_slow < served.count("fast"), served
    assert all_zero(await wait_conns(metrics, all_zero))


async def test_counts_return_to_zero_after_refused_servers_and_retries(gateway_factory, slow_fast) -> None:
    _, fast = slow_fast
    dead = f"127.0.0.1:{free_port()}"
    metrics = free_port()
    gw = gateway_factory(lc_config([dead, fast.address], metrics, "next_upstream_tries: 2"))
    for _ in range(6):
        assert (await get(f"{gw.url}/echo")).status == 200
    got = await wait_conns(metrics, all_zero)
    assert set(got) == {dead, fast.address}


async def test_counts_return_to_zero_after_an_upstream_cuts_its_answer(gateway_factory) -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await read_request(reader)
        if b" /head-only " in head:
            return  # closed before answering: 502
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 10)
        await writer.drain()  # then closed mid-body: the client's connection is cut

    async with ScriptUpstream(cut) as up:
        metrics = free_port()
        gw = gateway_factory(lc_config([up.address], metrics, route="    proxy_buffering: off"))
        assert (await get(f"{gw.url}/head-only")).status == 502
        with pytest.raises(aiohttp.ClientPayloadError):
            await get(f"{gw.url}/body")
        got = await wait_conns(metrics, all_zero)
        assert got == {up.address: 0}


def _open(port: int, data: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(data)
    return sock


async def test_counts_return_to_zero_after_client_aborts(gateway_factory) -> None:
    hang = Upstream("hang").start()
    try:
        metrics = free_port()
        # read_timeout 60s, longer than the wait: the count goes back when the client goes, not later
        gw = gateway_factory(
            lc_config(
                [hang.address],
                metrics,
                route="    proxy_buffering: off\n    proxy_request_buffering: off",
                read_timeout="60s",
            )
        )
        # 1. the client goes away while the upstream has not answered yet
        sock = _open(gw.port, b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
        await wait_conns(metrics, lambda got: got.get(hang.address) == 1)
        sock.close()
        await wait_conns(metrics, all_zero)
        # 2. the client goes away in the middle of a large unbuffered download
        sock = _open(gw.port, b"GET /download/200000000 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536)
        await wait_conns(metrics, lambda got: got.get(hang.address) == 1)
        sock.close()
        await wait_conns(metrics, all_zero)
        # 3. a streamed request body that the client cuts short
        sock = _open(gw.port, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"y" * 100)
        await wait_conns(metrics, lambda got: got.get(hang.address) == 1)
        sock.close()
        await wait_conns(metrics, all_zero)
        # and the server is still picked and answers: nothing was left counted
        assert (await get(f"{gw.url}/echo")).status == 200
        assert all_zero(await wait_conns(metrics, all_zero))
    finally:
        hang.stop()


async def test_a_websocket_holds_its_server_until_the_tunnel_closes(gateway_factory, slow_fast) -> None:
    slow, fast = slow_fast
    metrics = free_port()
    gw = gateway_factory(lc_config([slow.address, fast.address], metrics))
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(f"{gw.url}/ws") as ws:
            await ws.send_str("hi")
            assert (await ws.receive(timeout=5)).data == "echo:hi"
            held = await wait_conns(metrics, lambda got: sum(got.values()) == 1)
            busy = next(server for server, n in held.items() if n == 1)
            # least_conn sends the next requests to the other server while the tunnel is open
            for _ in range(3):
                reply = await get(f"{gw.url}/echo")
                assert reply.json()["server"] != ("slow" if busy == slow.address else "fast")
        assert all_zero(await wait_conns(metrics, all_zero))
