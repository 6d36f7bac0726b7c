"""The status page answers "is the app failing, or are we limiting?" at a glance.

Per route it shows the request rate and the app's 5xx rate (from, or for want of, the upstream;
a limit's 503 is not one) over the last 10 s beside the minute, and the upstream response
time; per zone, the last 10 s beside the minute. The client column of the limited keys is
filled even when the client is the key. Driven in a real headless Chromium (tests/cdp.py)
against the gateway started through its CLI.
"""

from __future__ import annotations

import json

import aiohttp
import pytest

from gateway.metrics.activity import Activity, merge
from tests.support.browser import Browser, find_chromium
from tests.support.ports import free_port
from tests.support.upstreams import Upstream

TOKEN = "glance-t0ken"


def config(upstream: Upstream, admin: int) -> object:
    def build(port: int) -> str:
        return f"""
listen: 127.0.0.1:{port}
admin: {{listen: 127.0.0.1:{admin}, token: {TOKEN}}}
real_ip: {{from: [127.0.0.1/32], header: X-Forwarded-For}}
zones:
  per_ip: {{type: req, key: $binary_remote_addr, rate: 1r/m}}
upstreams:
  app: {{servers: [{upstream.address}]}}
routes:
  - {{location: /limited/, upstream: app, limit_req: [{{zone: per_ip, nodelay: true}}]}}
  - {{location: /status/, upstream: app}}
  - {{location: /, upstream: app}}
"""

    return build


async def hit(url: str, n: int, headers: dict[str, str] | None = None) -> list[int]:
    out = []
    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            async with session.get(url, headers=headers or {}) as resp:
                await resp.read()
                out.append(resp.status)
    return out


async def activity(admin: int) -> dict[str, object]:
    async with aiohttp.ClientSession() as session:
        async with session.get(
            f"http://127.0.0.1:{admin}/status/activity", headers={"Authorization": f"Bearer {TOKEN}"}
        ) as resp:
            return dict(json.loads(await resp.text()))


async def traffic(gw_url: str) -> None:
    assert await hit(gw_url + "/status/500", 4) == [500] * 4  # the app fails
    assert await hit(gw_url + "/fine", 3) == [200] * 3
    # we limit: the first passes, the next four get the limit's 503
    assert await hit(gw_url + "/limited/x", 5, {"X-Forwarded-For": "203.0.113.9"}) == [200] + [503] * 4


async def test_activity_counts_per_route_app_errors_apart_from_limit_refusals(gateway_factory, upstream):
    admin = free_port()
    gw = gateway_factory(config(upstream, admin))
    await traffic(gw.url)
    body = await activity(admin)
    routes = {name: {f: sum(v) for f, v in series.items()} for name, series in body["routes"].items()}  # type: ignore[union-attr]
    assert routes["/status/"]["requests"] == 4 and routes["/status/"]["app_5xx"] == 4
    assert routes["/status/"]["upstream_n"] == 4
    assert routes["/"] == {**routes["/"], "requests": 3, "app_5xx": 0, "upstream_n": 3}
    assert routes["/limited/"]["requests"] == 5 and routes["/limited/"]["app_5xx"] == 0  # limiting, not failing
    assert routes["/limited/"]["upstream_n"] == 1
    assert [(k["key"], k["client"]) for k in body["top_keys"]] == [("203.0.113.9", "203.0.113.9")]  # type: ignore[union-attr,index]


def test_route_series_merge_across_workers():
    clock = [1_000_000.0]
    a, b = Activity(clock=lambda: clock[0]), Activity(clock=lambda: clock[0])
    a.response("/x", 502, "", "")
    b.response("/x", 200, "10.0.0.1:80", "0.250")
    b.response("/x", 503, "", "")  # a limit's refusal: no upstream
    merged = merge([a.snapshot(), b.snapshot()])
    series = merged["routes"]["/x"]
    assert (sum(series["requests"]), sum(series["app_5xx"])) == (3, 1)
    assert (sum(series["upstream_n"]), sum(series["upstream_ms"])) == (1, 250)
    clock[0] += 11 * 60  # quiet for the whole window: dropped
    assert a.snapshot()["routes"] == {}


@pytest.fixture
async def browser():
    binary = find_chromium()
    if binary is None:
        pytest.skip("no chromium binary (apt-get install chromium; scripts/test installs it)")
    b = await Browser(binary).start()
    yield b
    await b.close()


async def test_the_page_shows_routes_recent_rates_and_the_client(gateway_factory, upstream, browser):
    admin = free_port()
    gw = gateway_factory(config(upstream, admin))
    await traffic(gw.url)
    await browser.navigate(f"http://127.0.0.1:{admin}/")
    assert await browser.wait_for("!document.getElementById('login').hidden")
    await browser.evaluate(
        f"document.getElementById('token').value = {json.dumps(TOKEN)};"
        "document.getElementById('login').requestSubmit(); true"
    )
    await browser.wait_for("document.querySelectorAll('#routes tr[data-route]').length === 3")
    rows = await browser.evaluate(
        "Object.fromEntries([...document.querySelectorAll('#routes tr[data-route]')].map(tr =>"
        " [tr.dataset.route, [...tr.children].map(td => td.textContent)]))"
    )
    # within 10 s of the traffic, its rate over 10 s is at least its count / 10 (the minute's is diluted)
    assert float(rows["/status/"][3]) >= 0.4 and float(rows["/status/"][1]) >= 0.4, rows
    assert float(rows["/limited/"][3]) == 0 and float(rows["/limited/"][4]) == 0, rows  # limiting, not failing
    assert float(rows["/"][3]) == 0 and rows["/"][5].endswith(" ms"), rows
    assert await browser.evaluate(
        "document.querySelector('#routes tr[data-route=\"/status/\"] td.app5xx.bad') !== null"
    )
    # the zone: the last 10 s beside the minute
    recent = await browser.evaluate(
        "[...document.querySelectorAll('.zone[data-zone=per_ip] .rate.reject span')].map(s => s.textContent)"
    )
    assert float(recent[0]) >= 0.4 and recent[1].endswith("/1m") and float(recent[1].split()[0]) > 0, recent
    # the client column is filled when the client is the key
    assert await browser.evaluate("document.querySelector('#keys td.client').textContent") == "203.0.113.9"
