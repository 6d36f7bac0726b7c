"""The status page in a real headless Chromium, against a real gateway (its CLI) and upstream.

The browser is driven over the DevTools protocol (scripts/cdp.py, through tests/support/browser.py). Without a chromium binary
(scripts/test installs Debian's ``chromium``) the browser tests are skipped and say why.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable

import aiohttp
import pytest

from gateway.metrics import activity
from gateway.metrics.activity import Activity, merge
from tests.support.browser import Browser, find_chromium
from tests.support.config import config
from tests.support.gateway import cli
from tests.support.http import get
from tests.support.ports import free_port
from tests.support.upstreams import Upstream

TOKEN = "page-t0ken"
EVIL_KEY = "<img src=x onerror=window.__owned=1>"
EVIL_REASON = '<script>window.__owned=2</script><b onmouseover="x">'


ZONES = """  per_ip: {type: req, key: $binary_remote_addr, rate: 1r/m}
  per_user: {type: req, key: $http_x_user, rate: 1r/m}
  slow: {type: req, key: $binary_remote_addr, rate: 5r/s}"""
ROUTES = """  - {location: /api/, upstream: app, limit_req: [{zone: per_ip, burst: 1, nodelay: true}]}
  - {location: /slow/, upstream: app, limit_req: [{zone: slow, burst: 10}]}
  - {location: /, upstream: app, limit_req: [{zone: per_user, burst: 1, nodelay: true}]}"""


def page_config(upstream: Upstream, admin_port: int, store: str = "") -> Callable[[int], str]:
    top = store.strip() + "\nreal_ip: {from: [127.0.0.1/32], header: X-Forwarded-For}"
    return config(upstream, admin=admin_port, token=TOKEN, top=top, zones=ZONES, routes=ROUTES)


async def statuses(url: str, n: int, headers: dict[str, str]) -> list[int]:
    return [(await get(url, headers=headers))[0] for _ in range(n)]


@pytest.fixture
async def browser():
    binary = find_chromium()
    if binary is None:
        pytest.skip("no chromium binary (apt-get install chromium; scripts/test installs it)")
    b = await Browser(binary).start()
    yield b
    await b.close()


async def test_the_page_is_public_but_holds_no_data_and_forbids_framing(gateway_factory, upstream):
    admin = free_port()
    gateway_factory(page_config(upstream, admin))
    status, headers, body, _ = await get(f"http://127.0.0.1:{admin}/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    csp = headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "default-src 'none'" in csp
    assert headers["X-Frame-Options"] == "DENY"
    assert b'<script src="/status/page.js"' in body and b"<script>" not in body and b"style=" not in body
    for path, kind in (("/status/page.js", "text/javascript"), ("/status/page.css", "text/css")):
        status, headers, _, _ = await get(f"http://127.0.0.1:{admin}{path}")
        assert status == 200 and headers["Content-Type"].startswith(kind)
    status, headers, icon, _ = await get(f"http://127.0.0.1:{admin}/favicon.ico")
    assert status == 200 and icon.startswith(b"<svg")
    # The data needs the token; the browser protections stay in front of the page too.
    status, _, _, _ = await get(f"http://127.0.0.1:{admin}/status/activity")
    assert status == 401
    status, _, _, _ = await get(f"http://127.0.0.1:{admin}/", headers={"Host": "rebound.example"})
    assert status == 403
    status, _, _, _ = await get(f"http://127.0.0.1:{admin}/status/activity", headers={"Origin": "http://evil.example"})
    assert status == 403
    # A link from another site (a runbook) opens the page; nothing else is opened that way.
    link = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}
    assert (await get(f"http://127.0.0.1:{admin}/", headers=link))[0] == 200
    assert (await get(f"http://127.0.0.1:{admin}/", headers={**link, "Sec-Fetch-Dest": "iframe"}))[0] == 403
    assert (await get(f"http://127.0.0.1:{admin}/", headers={**link, "Sec-Fetch-Mode": "cors"}))[0] == 403
    assert (await get(f"http://127.0.0.1:{admin}/", headers={**link, "Host": "rebound.example"}))[0] == 403
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for path in ("/status/activity", "/bans", "/status/page.js"):
        assert (await get(f"http://127.0.0.1:{admin}{path}", headers={**link, **auth}))[0] == 403, path


async def test_activity_counts_outcomes_and_rejected_keys(gateway_factory, upstream):
    admin = free_port()
    gw = gateway_factory(page_config(upstream, admin))
    # per_ip: 1r/m with burst 1 and nodelay: two pass, the next three are rejected.
    got = await statuses(gw.url + "/api/x", 5, {"X-Forwarded-For": "203.0.113.7"})
    assert got == [200, 200, 503, 503, 503]
    got = await statuses(gw.url + "/other", 3, {"X-User": EVIL_KEY})
    assert got == [200, 200, 503]
    # slow: 5r/s, burst 10, no nodelay: the first passes, the next ones (sent at once) wait.
    async with aiohttp.ClientSession() as session:

        async def one() -> int:
            async with session.get(gw.url + "/slow/x") as resp:
                return resp.status

        assert await asyncio.gather(*(one() for _ in range(4))) == [200] * 4
    status, _, raw, _ = await get(
        f"http://127.0.0.1:{admin}/status/activity", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert status == 200
    body = json.loads(raw)
    totals = {zone: {o: sum(v) for o, v in series.items()} for zone, series in body["zones"].items()}
    assert totals == {
        "per_ip": {"passed": 2, "delayed": 0, "rejected": 3},
        "per_user": {"passed": 2, "delayed": 0, "rejected": 1},
        "slow": {"passed": 1, "delayed": 3, "rejected": 0},
    }
    keys = [(k["zone"], k["key"], k["client"], k["count"]) for k in body["top_keys"]]
    assert keys == [("per_ip", "203.0.113.7", "203.0.113.7", 3), ("per_user", EVIL_KEY, "127.0.0.1", 1)]
    assert body["upstreams"]["app"] == [
        {
            "server": upstream.address,
            "up": True,
            "down": False,
            "backup": False,
            "fails": 0,
            "max_fails": 1,
            "weight": 1,
        }
    ]
    assert body["redis_circuit"] is None

    assert body["config"]["hash"] == hashlib.sha256(gw.config_path.read_bytes()).hexdigest()[:16]
    assert body["config"]["reloaded_ms"] is None
    gw.write_config(gw.config_path.read_text() + "\n# changed\n")
    gw.reload()
    _, _, raw, _ = await get(f"http://127.0.0.1:{admin}/status/activity", headers={"Authorization": f"Bearer {TOKEN}"})
    after = json.loads(raw)["config"]
    assert after["hash"] == hashlib.sha256(gw.config_path.read_bytes()).hexdigest()[:16] != body["config"]["hash"]
    assert after["reloads"] == 1 and after["last_reload_ok"] is True and after["reloaded_ms"] >= after["loaded_ms"]


async def test_activity_with_redis_reports_the_circuit(gateway_factory, upstream, redis_server):
    admin = free_port()
    store = f'store: {{redis: {{url: "{redis_server.url}", timeout: 200ms, prefix: "page:"}}}}'
    gw = gateway_factory(page_config(upstream, admin, store))
    assert await statuses(gw.url + "/api/x", 3, {"X-Forwarded-For": "203.0.113.9"}) == [200, 200, 503]
    auth = {"Authorization": f"Bearer {TOKEN}"}
    body = json.loads((await get(f"http://127.0.0.1:{admin}/status/activity", headers=auth)).body)
    assert body["redis_circuit"] == "closed"
    assert [(k["zone"], k["key"], k["count"]) for k in body["top_keys"]] == [("per_ip", "203.0.113.9", 1)]
    redis_server.stop()
    for _ in range(10):  # on_error allow: they pass, and the failures open the circuit
        await get(gw.url + "/api/x", headers={"X-Forwarded-For": "203.0.113.10"})
    body = json.loads((await get(f"http://127.0.0.1:{admin}/status/activity", headers=auth)).body)
    assert body["redis_circuit"] == "open"


async def test_with_workers_the_master_serves_the_page_with_every_workers_counts(gateway_factory, upstream):
    """The master serves the admin API; the counts live in the workers and reach it over the
    stats channel (the one /metrics uses): one answer for the node."""
    admin = free_port()
    gw = gateway_factory(page_config(upstream, admin, "workers: 2"))
    assert (await get(f"http://127.0.0.1:{admin}/"))[0] == 200
    # new connections each: the kernel spreads them over both workers; the zone is node-wide
    assert sorted(await statuses(gw.url + "/api/x", 4, {"X-Forwarded-For": "203.0.113.7"})) == [200, 200, 503, 503]
    for _ in range(100):  # until both workers have started and joined the channel
        body = json.loads(
            (await get(f"http://127.0.0.1:{admin}/status/activity", headers={"Authorization": f"Bearer {TOKEN}"})).body
        )
        if body["workers"] == {"running": 2, "reported": 2}:
            break
        await asyncio.sleep(0.1)
    assert body["workers"] == {"running": 2, "reported": 2}
    assert body["config"]["hash"] == hashlib.sha256(gw.config_path.read_bytes()).hexdigest()[:16]
    series = body["zones"]["per_ip"]
    assert (sum(series["passed"]), sum(series["rejected"])) == (2, 2)
    assert [(k["zone"], k["key"], k["count"]) for k in body["top_keys"]] == [("per_ip", "203.0.113.7", 2)]
    assert body["redis_circuit"] is None


async def test_page_in_chromium_shows_keys_and_bans_and_unbans(gateway_factory, upstream, browser):
    admin = free_port()
    gw = gateway_factory(page_config(upstream, admin))
    conf = str(gw.config_path)
    page = f"http://127.0.0.1:{admin}/"
    await statuses(gw.url + "/api/x", 4, {"X-Forwarded-For": "203.0.113.7"})
    await statuses(gw.url + "/other", 3, {"X-User": EVIL_KEY})

    await browser.navigate(page)
    # Asked for the token once, then kept in sessionStorage.
    assert await browser.wait_for("!document.getElementById('login').hidden")
    await browser.evaluate(
        f"document.getElementById('token').value = {json.dumps(TOKEN)};"
        "document.getElementById('login').requestSubmit(); true"
    )
    assert await browser.evaluate("sessionStorage.getItem('gateway-admin-token')") == TOKEN
    # The keys rejected a moment ago are in the table, the hostile one as text.
    await browser.wait_for("document.querySelectorAll('#keys tr[data-key]').length === 2")
    shown = await browser.evaluate("[...document.querySelectorAll('#keys td.key')].map(td => td.textContent)")
    assert shown == ["203.0.113.7", EVIL_KEY]
    assert await browser.evaluate("document.querySelectorAll('img, #keys b').length") == 0
    assert await browser.evaluate("window.__owned === undefined")
    rates = await browser.evaluate(
        "[...document.querySelectorAll('.zone')].map(z => [z.dataset.zone, z.querySelectorAll('rect.r').length > 0])"
    )
    assert rates == [["per_ip", True], ["per_user", True]]

    # A ban added with the CLI appears (with its hostile reason as text), with its expiry.
    banned = cli("ban", "198.51.100.9", "--for", "2h", "--reason", EVIL_REASON, "-c", conf)
    assert banned.returncode == 0, banned.stderr
    await browser.wait_for("!!document.querySelector('#bans tr[data-target=\"198.51.100.9/32\"]')")
    row = await browser.evaluate(
        "[...document.querySelectorAll('#bans tr[data-target=\"198.51.100.9/32\"] td')].map(td => td.textContent)"
    )
    assert row[0] == "198.51.100.9/32" and row[1] == EVIL_REASON and row[2] in ("in 2h 0m", "in 1h 59m")
    assert await browser.evaluate("window.__owned === undefined && document.querySelectorAll('#bans b').length === 0")

    # One-click ban of a top key, then unban from the page.
    await browser.evaluate("document.querySelector('#keys button.ban[data-target=\"203.0.113.7\"]').click(); true")
    await browser.wait_for("!!document.querySelector('#bans tr[data-target=\"203.0.113.7/32\"]')")
    listed = json.loads(cli("bans", "--json", "-c", conf).stdout)
    assert sorted(b["target"] for b in listed) == ["198.51.100.9/32", "203.0.113.7/32"]
    assert (await get(gw.url + "/api/x", headers={"X-Forwarded-For": "203.0.113.7"}))[0] == 403

    await browser.evaluate(
        "document.querySelector('#bans button.unban[data-target=\"198.51.100.9/32\"]').click(); true"
    )
    await browser.wait_for("!document.querySelector('#bans tr[data-target=\"198.51.100.9/32\"]')")
    listed = json.loads(cli("bans", "--json", "-c", conf).stdout)
    assert [b["target"] for b in listed] == ["203.0.113.7/32"]

    # The whole visit (favicon included) without one console error or failed request.
    assert browser.problems() == []
    urls = [url for url, _ in browser.responses()]
    assert f"http://127.0.0.1:{admin}/status/page.js" in urls and f"http://127.0.0.1:{admin}/status/activity" in urls
    status, _, _, _ = await get(f"http://127.0.0.1:{admin}/favicon.ico")
    assert status == 200

    # A wrong token: the page asks again.
    mark = len(browser.events)
    await browser.evaluate("sessionStorage.setItem('gateway-admin-token', 'wrong'); true")
    await browser.wait_for("!document.getElementById('login').hidden", timeout=10)
    assert "refused" in await browser.evaluate("document.getElementById('login-error').textContent")
    assert all("401" in p or "status of 401" in p for p in browser.problems(mark))


async def test_page_favicon_request_is_answered(gateway_factory, upstream, browser):
    """A browser that opens /favicon.ico itself (as it does for a page without an icon link)."""
    admin = free_port()
    gateway_factory(page_config(upstream, admin))
    await browser.navigate(f"http://127.0.0.1:{admin}/favicon.ico")
    assert browser.problems() == []
    assert (f"http://127.0.0.1:{admin}/favicon.ico", 200) in browser.responses()


# -- the counting itself (no browser) -----------------------------------------------------------


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_buckets_roll_over_and_snapshots_merge() -> None:
    clock = Clock(1_000_000.0)
    one, two = Activity(clock), Activity(clock)
    one.record("z", activity.PASSED)
    clock.now += activity.BUCKET_S
    one.record("z", activity.PASSED)
    one.reject("z", b"\xc0\x00\x02\x01", None)
    two.record("z", activity.DELAYED)
    two.reject("z", b"\xc0\x00\x02\x01", None)
    first = one.snapshot()
    assert first["zones"]["z"]["passed"][-2:] == [1, 1]
    assert first["zones"]["z"]["rejected"][-1] == 1
    assert first["top_keys"][0]["key"] == "192.0.2.1"
    clock.now += activity.BUCKET_S * activity.BUCKETS  # everything has slid out: the zone is forgotten
    assert one.snapshot()["zones"] == {} and one.snapshot()["top_keys"] == [] and one.zones == {} and one.keys == {}
    clock.now -= activity.BUCKET_S * activity.BUCKETS
    merged = merge([first, two.snapshot()])
    assert merged["zones"]["z"]["passed"][-2:] == [1, 1]
    assert merged["zones"]["z"]["delayed"][-1] == 1 and merged["zones"]["z"]["rejected"][-1] == 2
    assert merged["top_keys"] == [
        {"zone": "z", "key": "192.0.2.1", "client": "", "count": 2, "last_ms": int(clock.now * 1000)}
    ]
    # An older snapshot is shifted onto the newest one's buckets.
    clock.now += activity.BUCKET_S
    later = merge([first, Activity(clock).snapshot()])
    assert later["zones"]["z"]["passed"][-3:] == [1, 1, 0]


def test_rejected_keys_stay_bounded_under_a_flood_of_distinct_keys() -> None:
    clock = Clock(1_000_000.0)
    act = Activity(clock)
    for _ in range(50):
        act.reject("z", b"heavy", None)
    for i in range(20 * activity.MAX_KEYS):
        act.reject("z", b"k%d" % i, None)
    assert len(act.keys["z"]) <= activity.MAX_KEYS
    top = act.snapshot()["top_keys"]
    assert top[0]["key"] == "heavy" and top[0]["count"] == 50 and len(top) == activity.TOP_KEYS


def test_key_text() -> None:
    assert activity.key_text(b"\x20\x01\x0d\xb8" + bytes(12)) == "2001:db8::"
    assert activity.key_text(b"\xff" + bytes(range(16))) == "hashed:" + bytes(range(16)).hex()
    assert activity.key_text(b"user-1") == "user-1"
    assert activity.key_text(b"abcd") == "abcd"  # printable 4 bytes stay text
    assert activity.key_text(b"caf\xc3\xa9\xff") == "café\\xff"
