"""A WebSocket handshake leaves the same upstream record as a plain request (gateway/proxy/nextupstream.py).

The gateway runs through its CLI; the upstream is an aiohttp WebSocket server on a real
socket in the test's loop, which waits a known time before its 101. After a handshake,
``/metrics`` (the metrics listener) has one ``gateway_upstream_duration_seconds`` sample for
the upstream: the handshake's time, there while the tunnel is still open, and no second
one when it closes. A server that refuses the connection is tried, logged, counted against
(``max_fails``) and passed over for the next one, as for plain requests.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType, web
from prometheus_client.parser import text_string_to_metric_families

from tests.support.gateway import Gateway
from tests.support.ports import free_port

HANDSHAKE_DELAY = 0.3  # the upstream's wait before its 101
DURATION = "gateway_upstream_duration_seconds"

Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


class SlowHandshakeUpstream:
    """An aiohttp WebSocket server that answers the handshake after ``HANDSHAKE_DELAY``, then echoes."""

    def __init__(self) -> None:
        self.port = free_port()
        self.handshakes = 0
        self.runner: web.AppRunner | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> SlowHandshakeUpstream:
        app = web.Application()
        app.router.add_get("/ws", self._ws)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        self.handshakes += 1
        await asyncio.sleep(HANDSHAKE_DELAY)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            if msg.type is WSMsgType.TEXT:
                await ws.send_str("echo:" + msg.data)
        return ws

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def ws_upstream() -> AsyncIterator[SlowHandshakeUpstream]:
    upstream = await SlowHandshakeUpstream().start()
    yield upstream
    await upstream.stop()


def config(port: int, metrics_port: int, servers: str) -> str:
    return f"""
listen: 127.0.0.1:{port}
admin: {{listen: off}}
metrics: {{listen: 127.0.0.1:{metrics_port}}}
log: {{format: json}}
upstreams:
  app: {{servers: [{servers}], connect_timeout: 1s, read_timeout: 5s}}
routes:
  - {{location: /, upstream: app}}
"""


async def scrape(port: int) -> Samples:
    """Every sample of ``/metrics``: {sample name: {sorted labels: value}}."""
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as resp:
        text = await resp.text()
        assert resp.status == 200, text
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get(name, {}).get(tuple(sorted(labels.items())), 0.0)


async def scrape_until(port: int, done: Callable[[Samples], bool]) -> Samples:
    """Scrape until ``done`` holds (or 5 s pass: then the last scrape, for the assertion to show)."""
    deadline = time.monotonic() + 5
    while True:
        samples = await scrape(port)
        if done(samples) or time.monotonic() > deadline:
            return samples
        await asyncio.sleep(0.05)


async def log_entry(gw: Gateway, path: str) -> dict[str, Any]:
    """The access log's JSON entry for ``path`` (the log is flushed every 100 ms)."""
    async with asyncio.timeout(5):
        while True:
            for line in gw.stdout().splitlines():
                if line.strip() and f'"{path}' in line:
                    return dict(json.loads(line))
            await asyncio.sleep(0.05)


async def test_a_handshake_is_one_upstream_duration_sample_taken_at_the_101(gateway_factory, ws_upstream):
    metrics_port = free_port()
    gw = gateway_factory(lambda p: config(p, metrics_port, ws_upstream.address))
    before = await scrape(metrics_port)
    assert value(before, f"{DURATION}_count", upstream="app") == 0
    async with aiohttp.ClientSession() as session, session.ws_connect(gw.url + "/ws") as ws:
        await ws.send_str("hi")
        assert (await ws.receive(timeout=5)).data == "echo:hi"
        # The tunnel is open: the handshake's sample is there already.
        during = await scrape_until(metrics_port, lambda s: value(s, f"{DURATION}_count", upstream="app") >= 1)
        assert value(during, f"{DURATION}_count", upstream="app") == 1
        handshake_time = value(during, f"{DURATION}_sum", upstream="app")
        assert handshake_time >= HANDSHAKE_DELAY
        await asyncio.sleep(2 * HANDSHAKE_DELAY)  # the tunnel lives on
    entry = await log_entry(gw, "/ws")
    assert entry["status"] == 101
    assert entry["upstream_addr"] == ws_upstream.address
    assert entry["upstream_status"] == "101"
    # $upstream_response_time covers the tunnel's life, as in nginx; the metric only the handshake.
    assert float(entry["upstream_response_time"]) > handshake_time + HANDSHAKE_DELAY
    after = await scrape(metrics_port)
    assert value(after, f"{DURATION}_count", upstream="app") == 1  # closing the tunnel added none
    assert value(after, f"{DURATION}_sum", upstream="app") == handshake_time
    assert value(after, f"{DURATION}_bucket", upstream="app", le="+Inf") == 1


async def test_a_refused_first_server_passes_the_handshake_to_the_next(gateway_factory, ws_upstream):
    dead = f"127.0.0.1:{free_port()}"  # nothing listens: the connection is refused
    metrics_port = free_port()
    gw = gateway_factory(lambda p: config(p, metrics_port, f"{dead}, {ws_upstream.address}"))
    async with aiohttp.ClientSession() as session, session.ws_connect(gw.url + "/ws") as ws:
        await ws.send_str("through")
        assert (await ws.receive(timeout=5)).data == "echo:through"
        samples = await scrape_until(metrics_port, lambda s: value(s, f"{DURATION}_count", upstream="app") >= 1)
    assert ws_upstream.handshakes == 1
    # one request, one sample, whatever the number of servers tried
    assert value(samples, f"{DURATION}_count", upstream="app") == 1
    assert value(samples, f"{DURATION}_sum", upstream="app") >= HANDSHAKE_DELAY
    # the refusal counts against the dead server (max_fails 1): it is out for fail_timeout
    assert value(samples, "gateway_upstream_server_up", upstream="app", server=dead) == 0
    assert value(samples, "gateway_upstream_server_up", upstream="app", server=ws_upstream.address) == 1
    entry = await log_entry(gw, "/ws")
    assert entry["status"] == 101
    assert entry["upstream_addr"] == f"{dead}, {ws_upstream.address}"
    assert entry["upstream_status"] == "502, 101"
    errors = gw.stderr()
    assert any(
        "connect() failed" in line and "while talking to upstream" in line and f'upstream: "{dead}"' in line
        for line in errors.splitlines()
    ), errors
    assert f'upstream server temporarily disabled: {dead} in upstream "app"' in errors, errors


async def test_a_handshake_no_server_answers_is_a_502_with_its_tries_recorded(gateway_factory):
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    metrics_port = free_port()
    gw = gateway_factory(lambda p: config(p, metrics_port, ", ".join(dead)))
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(gw.url + "/nowhere")
    assert refused.value.status == 502
    entry = await log_entry(gw, "/nowhere")
    assert entry["status"] == 502
    assert entry["upstream_addr"] == ", ".join(dead)
    assert entry["upstream_status"] == "502, 502"
    samples = await scrape_until(metrics_port, lambda s: value(s, f"{DURATION}_count", upstream="app") >= 1)
    assert value(samples, f"{DURATION}_count", upstream="app") == 1
