"""``metrics.listen`` keeps web pages out as the admin API does: a DNS-rebinding page (a foreign
``Host`` on a loopback listener), a foreign ``Origin`` or a cross-site fetch is refused before
any counter is read; a scraper that sends what Prometheus sends is answered."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.ports import free_port, wait_port
from tests.support.upstreams import Upstream


def config(upstream: Upstream, metrics: int) -> object:
    def build(port: int) -> str:
        return f"""
listen: 127.0.0.1:{port}
admin: {{listen: off}}
metrics: {{listen: 127.0.0.1:{metrics}}}
upstreams:
  app: {{servers: [{upstream.address}]}}
routes:
  - {{location: /secret-route-name/, upstream: app}}
"""

    return build


async def get(port: int, headers: dict[str, str]) -> tuple[int, bytes]:
    """GET /metrics with exactly these headers (no client library adding or fixing any)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    head = "GET /metrics HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write((head + "Connection: close\r\n\r\n").encode("latin-1"))
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return int(data.split(b" ", 2)[1]), data.partition(b"\r\n\r\n")[2]


@pytest.fixture
def metrics_port(gateway_factory, upstream) -> int:
    port = free_port()
    gateway_factory(config(upstream, port))
    wait_port(port)
    return port


async def test_what_prometheus_sends_is_answered(metrics_port):
    for host in (f"127.0.0.1:{metrics_port}", f"localhost:{metrics_port}", "127.0.0.1"):
        status, body = await get(
            metrics_port,
            {
                "Host": host,
                "User-Agent": "Prometheus/2.42.0",
                "Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
                "X-Prometheus-Scrape-Timeout-Seconds": "10",
            },
        )
        assert status == 200 and b"gateway_requests_total" in body, host
    status, _ = await get(
        metrics_port, {"Host": f"127.0.0.1:{metrics_port}", "Origin": f"http://127.0.0.1:{metrics_port}"}
    )
    assert status == 200  # its own origin


@pytest.mark.parametrize(
    "headers",
    [
        {"Host": "rebind.attacker.example"},  # DNS rebinding: the page's name, re-pointed at 127.0.0.1
        {"Host": "rebind.attacker.example:{port}"},
        {"Host": "127.0.0.1:{port}", "Origin": "http://attacker.example"},
        {"Host": "127.0.0.1:{port}", "Origin": "null"},
        {"Host": "127.0.0.1:{port}", "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"},
    ],
)
async def test_a_web_page_gets_nothing(metrics_port, headers):
    sent = {name: value.replace("{port}", str(metrics_port)) for name, value in headers.items()}
    status, body = await get(metrics_port, sent)
    assert status == 403, sent
    assert b"gateway_" not in body and b"secret-route-name" not in body
