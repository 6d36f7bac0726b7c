"""Prometheus metrics end to end: the CLI-started gateway, real upstreams, scraped and parsed."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Callable

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.config import config
from tests.support.gateway import cli
from tests.support.http import status
from tests.support.ports import free_port
from tests.support.upstreams import Upstream

TOKEN = "s3cret"
BANNED_IP = "203.0.113.9"


MIX_ZONES = """  fast: {type: req, key: $binary_remote_addr, rate: 1r/s}
  slow: {type: req, key: $binary_remote_addr, rate: 1r/s}
  dry: {type: req, key: $binary_remote_addr, rate: 1r/m}
  trap: {type: req, key: $binary_remote_addr, rate: 1r/m, ban: 60s}"""
MIX_ROUTES = """  - {location: /pass, upstream: app, limit_req: [{zone: fast, burst: 100, nodelay: true}]}
  - {location: /delay, upstream: app, limit_req: [{zone: slow, burst: 2}]}
  - {location: /dry, upstream: app, dry_run: true, limit_req: [{zone: dry}]}
  - {location: /trap, upstream: app, limit_req: [{zone: trap}]}"""


def mix_config(upstream: Upstream, admin_port: int, workers: int, extra: str = "") -> Callable[[int], str]:
    top = f"workers: {workers}\nshutdown_timeout: 5s\nreal_ip: {{from: [127.0.0.1], header: X-Forwarded-For}}"
    return config(
        upstream,
        top=top,
        admin=admin_port,
        token=TOKEN,
        zones=MIX_ZONES,
        upstream_options="read_timeout: 5s",
        routes=MIX_ROUTES,
        extra=extra,
    )


async def scrape(url: str, token: str | None = TOKEN) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Every sample of the scrape: {sample name: {sorted labels: value}}."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session:
        async with session.get(url, headers=headers) as resp:
            text = await resp.text()
            assert resp.status == 200, text
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get(name, {}).get(tuple(sorted(labels.items())), 0.0)


async def wait_workers(gw, count: int) -> None:
    deadline = time.monotonic() + 20
    while len(set(re.findall(r"\] (\d+)#0: listening on", gw.stderr()))) < count:
        assert time.monotonic() < deadline, gw.stderr()
        await asyncio.sleep(0.05)


@pytest.mark.timing
@pytest.mark.parametrize("workers", [1, 2])
async def test_a_known_mix_of_requests_gives_exact_counts(gateway_factory, upstream, workers):
    admin = free_port()
    gw = gateway_factory(mix_config(upstream, admin, workers))
    await wait_workers(gw, workers)
    metrics_url = f"http://127.0.0.1:{admin}/metrics"
    before = await scrape(metrics_url)
    assert value(before, "gateway_requests_total", route="/pass", status="200") == 0

    # passed: 3 through a zone that always passes
    assert [await status(gw.url + "/pass") for _ in range(3)] == [200] * 3
    # 4 at once at 1r/s with burst 2: the first passes, two wait (about 1 s and 2 s), one is rejected
    delayed = sorted(await asyncio.gather(*(status(gw.url + "/delay") for _ in range(4))))
    assert delayed == [200, 200, 200, 503]
    # dry run: the second is over the rate, logged as rejected, and still served
    assert [await status(gw.url + "/dry") for _ in range(2)] == [200, 200]
    # a zone ban: the second request is rejected and bans the key, the third meets the ban
    assert [await status(gw.url + "/trap") for _ in range(3)] == [200, 503, 503]
    # a manual ban, through the CLI
    done = cli("ban", BANNED_IP, "--reason", "metrics test", "-c", str(gw.config_path))
    assert done.returncode == 0, done.stderr
    await asyncio.sleep(0.3)  # the master pushes it to every worker
    for _ in range(2):
        assert await status(gw.url + "/pass", headers={"X-Forwarded-For": BANNED_IP}) == 403
    await asyncio.sleep(0.2)  # the last access-log call runs just after the response went out

    s = await scrape(metrics_url)
    requests = {labels: n for labels, n in s["gateway_requests_total"].items() if n}
    assert requests == {
        (("route", "/pass"), ("status", "200")): 3,
        (("route", "/pass"), ("status", "403")): 2,
        (("route", "/delay"), ("status", "200")): 3,
        (("route", "/delay"), ("status", "503")): 1,
        (("route", "/dry"), ("status", "200")): 2,
        (("route", "/trap"), ("status", "200")): 1,
        (("route", "/trap"), ("status", "503")): 2,
    }
    decisions = {labels: n for labels, n in s["gateway_limit_decisions_total"].items() if n}
    expected = {
        ("fast", "limit_req", "passed"): 3,
        ("slow", "limit_req", "passed"): 1,
        ("slow", "limit_req", "delayed"): 2,
        ("slow", "limit_req", "rejected"): 1,
        ("dry", "limit_req", "passed"): 1,
        ("dry", "limit_req", "rejected_dry_run"): 1,
        ("trap", "limit_req", "passed"): 1,
        ("trap", "limit_req", "rejected"): 1,
        ("trap", "limit_req", "banned"): 1,
        ("", "ban", "banned"): 2,
    }
    assert decisions == {(("kind", k), ("outcome", o), ("zone", z)): n for (z, k, o), n in expected.items()}
    # histograms: every request once; the two delays (about 1 s and 2 s) in zone "slow"
    assert value(s, "gateway_request_duration_seconds_count", route="/delay") == 4
    assert value(s, "gateway_request_duration_seconds_count", route="/pass") == 5
    assert value(s, "gateway_limit_delay_seconds_count", zone="slow") == 2
    assert value(s, "gateway_limit_delay_seconds_bucket", zone="slow", le="0.5") == 0
    assert value(s, "gateway_limit_delay_seconds_bucket", zone="slow", le="2.5") == 2
    assert 2.0 <= value(s, "gateway_limit_delay_seconds_sum", zone="slow") <= 3.0
    # proxied: 3 + 3 + 2 + 1
    assert value(s, "gateway_upstream_duration_seconds_count", upstream="app") == 9
    assert value(s, "gateway_bans_active") == 1
    assert value(s, "gateway_upstream_server_up", upstream="app", server=upstream.address) == 1
    assert value(s, "gateway_connections", state="active") >= 0
    assert value(s, "gateway_config_info", hash=_hash(gw.config_path)) == 1
    assert value(s, "gateway_config_reloads_total", result="success") == 0
    assert "gateway_redis_circuit_open" not in s or value(s, "gateway_redis_circuit_open") == 0

    assert value(s, "gateway_workers_reporting") == workers

    # counts are exact scrape after scrape (a scrape does not count itself, nor reset anything)
    again = await scrape(metrics_url)
    assert again["gateway_requests_total"] == s["gateway_requests_total"]
    if workers > 1:
        # Workers that stop (here: each one in turn, and the master starts another) leave their
        # counters in the node's totals: nothing goes backwards.
        for pid in set(re.findall(r"\] (\d+)#0: listening on", gw.stderr())):
            os.kill(int(pid), signal.SIGTERM)
        await wait_workers(gw, 2 * workers)  # the replacements are listening
        after = await scrape(metrics_url)
        assert after["gateway_requests_total"] == s["gateway_requests_total"]
        assert after["gateway_limit_decisions_total"] == s["gateway_limit_decisions_total"]
        assert value(after, "gateway_workers_reporting") == workers
        assert await status(gw.url + "/pass") == 200
        await asyncio.sleep(0.2)
        later = await scrape(metrics_url)
        assert value(later, "gateway_requests_total", route="/pass", status="200") == 4


def _hash(path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


@pytest.mark.parametrize("workers", [1, 2])
async def test_the_admin_metrics_need_the_token_and_metrics_listen_serves_them_without(
    gateway_factory, upstream, workers
):
    admin, metrics = free_port(), free_port()
    gw = gateway_factory(mix_config(upstream, admin, workers, f"metrics: {{listen: 127.0.0.1:{metrics}}}\n"))
    await wait_workers(gw, workers)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{admin}/metrics") as resp:
            assert resp.status == 401
        async with session.get(f"http://127.0.0.1:{admin}/metrics", headers={"Authorization": "Bearer no"}) as resp:
            assert resp.status == 401
        # the metrics listener serves /metrics only
        async with session.get(f"http://127.0.0.1:{metrics}/status") as resp:
            assert resp.status == 404
    assert await status(gw.url + "/pass") == 200
    await asyncio.sleep(0.2)
    open_scrape = await scrape(f"http://127.0.0.1:{metrics}/metrics", token=None)
    assert value(open_scrape, "gateway_requests_total", route="/pass", status="200") == 1
    first_hash = _hash(gw.config_path)
    assert value(open_scrape, "gateway_config_info", hash=first_hash) == 1

    # reloads: one that works (the hash follows the file), one that fails (the hash stays)
    gw.write_config(gw.config_path.read_text() + "# changed\n")
    gw.reload()
    broken = gw.config_path.read_text()
    gw.write_config(broken.replace("rate: 1r/m, ban: 60s", "rate: fast"))
    gw.reload()
    s = await scrape(f"http://127.0.0.1:{metrics}/metrics", token=None)
    assert value(s, "gateway_config_reloads_total", result="success") == 1
    assert value(s, "gateway_config_reloads_total", result="failure") == 1
    assert value(s, "gateway_config_info", hash=first_hash) == 0
    assert sum(s["gateway_config_info"].values()) == 1
    assert next(iter(s["gateway_config_info"]))[0][1] != first_hash


def test_a_bad_metrics_section_names_file_and_line(tmp_path):
    conf = tmp_path / "limits.yaml"
    conf.write_text(
        "listen: 127.0.0.1:8080\n"
        "upstreams:\n  app: {servers: [127.0.0.1:9000]}\n"
        "routes:\n  - {location: /, upstream: app}\n"
        "metrics:\n  listen: 127.0.0.1:99999\n  scrape: yes\n"
    )
    done = cli("check", "-c", str(conf))
    assert done.returncode != 0
    assert f"{conf}:7" in done.stderr and "metrics.listen" in done.stderr, done.stderr
    assert f"{conf}:8" in done.stderr and "unknown key 'scrape'" in done.stderr, done.stderr
    conf.write_text(
        conf.read_text().replace("  listen: 127.0.0.1:99999\n  scrape: yes\n", "  listen: 127.0.0.1:8080\n")
    )
    done = cli("check", "-c", str(conf))
    assert done.returncode != 0 and "already used by listen" in done.stderr, done.stderr


async def test_upstream_server_up_drops_to_0_after_max_fails(gateway_factory, upstream):
    admin = free_port()
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there: connects are refused

    def build(port: int) -> str:
        return f"""
listen: 127.0.0.1:{port}
admin: {{listen: 127.0.0.1:{admin}, token: {TOKEN}}}
upstreams:
  app:
    servers:
      - {{address: {upstream.address}}}
      - {{address: {dead}, max_fails: 2, fail_timeout: 60s}}
routes:
  - {{location: /, upstream: app}}
"""

    gw = gateway_factory(build)
    url = f"http://127.0.0.1:{admin}/metrics"
    s = await scrape(url)
    assert value(s, "gateway_upstream_server_up", upstream="app", server=dead) == 1
    assert value(s, "gateway_upstream_server_up", upstream="app", server=upstream.address) == 1
    statuses = []
    for _ in range(8):  # round robin: the dead server is tried (and fails over) every other request
        statuses.append(await status(gw.url + "/echo"))
        s = await scrape(url)
        if value(s, "gateway_upstream_server_up", upstream="app", server=dead) == 0:
            break
    assert statuses == [200] * len(statuses)
    assert value(s, "gateway_upstream_server_up", upstream="app", server=dead) == 0
    assert value(s, "gateway_upstream_server_up", upstream="app", server=upstream.address) == 1
    assert "connect() failed" in gw.stderr() and gw.stderr().count(dead) >= 2


async def test_redis_store_with_two_workers_counts_calls_and_the_circuit(gateway_factory, upstream, redis_server):
    admin = free_port()
    store = f'store:\n  redis: {{url: "{redis_server.url}", timeout: 200ms, on_error: allow, prefix: "m:"}}\n'
    gw = gateway_factory(mix_config(upstream, admin, 2, store))
    await wait_workers(gw, 2)
    url = f"http://127.0.0.1:{admin}/metrics"
    assert [await status(gw.url + "/pass") for _ in range(3)] == [200] * 3
    assert sorted(await asyncio.gather(*(status(gw.url + "/delay") for _ in range(4)))) == [200, 200, 200, 503]
    await asyncio.sleep(0.2)
    s = await scrape(url)
    assert value(s, "gateway_workers_reporting") == 2
    assert value(s, "gateway_limit_decisions_total", zone="fast", kind="limit_req", outcome="passed") == 3
    assert value(s, "gateway_limit_decisions_total", zone="slow", kind="limit_req", outcome="passed") == 1
    assert value(s, "gateway_limit_decisions_total", zone="slow", kind="limit_req", outcome="delayed") == 2
    assert value(s, "gateway_limit_decisions_total", zone="slow", kind="limit_req", outcome="rejected") == 1
    # A call is a batch: the 3 sequential requests one each, the 4 concurrent ones share calls
    # per worker (at least one call, at most one each).
    calls = value(s, "gateway_redis_calls_total", outcome="ok")
    assert 4 <= calls <= 7
    assert value(s, "gateway_redis_call_duration_seconds_count") == calls
    assert value(s, "gateway_redis_circuit_open") == 0

    redis_server.kill()  # Redis goes away: calls fail, the circuit opens, on_error lets requests through
    for _ in range(12):
        assert await status(gw.url + "/pass") == 200
    await asyncio.sleep(0.2)
    s = await scrape(url)
    failed = value(s, "gateway_redis_calls_total", outcome="error") + value(
        s, "gateway_redis_calls_total", outcome="timeout"
    )
    assert failed >= 1
    assert failed + value(s, "gateway_redis_calls_total", outcome="circuit_open") == 12
    assert value(s, "gateway_redis_circuit_open") == 1


@pytest.mark.parametrize(
    "store,workers", [("embedded", 1), ("embedded", 2), pytest.param("redis", 1, marks=pytest.mark.redis)]
)
async def test_served_requests_leave_no_garbage_cycles(gateway_factory, upstream, request, store, workers):
    """A request's objects are freed by reference counting when it ends, not left in a cycle
    for the cyclic collector (whose passes over them once cost ~10% of the CPU of a request).
    With Redis, decisions go out in batches. (With workers: 2 the workers are counted; the
    master's own collector is not in /metrics.)"""
    admin = free_port()
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there: 502
    store_section = ""
    if store == "redis":
        url = request.getfixturevalue("redis_server").url
        store_section = f'store:\n  redis: {{url: "{url}", timeout: 2s, prefix: "g:"}}'

    def build(port: int) -> str:
        return f"""
listen: 127.0.0.1:{port}
workers: {workers}
admin: {{listen: 127.0.0.1:{admin}, token: {TOKEN}}}
{store_section}
zones:
  ip: {{type: req, key: $binary_remote_addr, rate: 100000r/s}}
  conns: {{type: conn, key: $binary_remote_addr}}
  tight: {{type: req, key: $binary_remote_addr, rate: 1r/m}}
upstreams:
  app: {{servers: [{upstream.address}]}}
  dead: {{servers: ["{dead}"]}}
routes:
  - {{location: /dead, upstream: dead}}
  - {{location: /limited, upstream: app, limit_req: [{{zone: ip, burst: 1000}}], limit_conn: [{{zone: conns, max: 100}}]}}
  - {{location: /rejected, upstream: app, limit_req: [{{zone: tight}}]}}
  - {{location: /nowhere, return: {{code: 404}}}}
  - {{location: /, upstream: app}}
"""

    gw = gateway_factory(build)
    await wait_workers(gw, workers)
    url = f"http://127.0.0.1:{admin}/metrics"

    def collected(samples: dict) -> float:
        return sum(samples["python_gc_objects_collected_total"].values())

    before = await scrape(url)
    assert set(dict(labels)["generation"] for labels in before["python_gc_collections_total"]) == {"0", "1", "2"}
    async with aiohttp.ClientSession() as session:

        async def call(path: str, body: bytes | None = None) -> int:
            async with session.request("GET" if body is None else "POST", gw.url + path, data=body) as resp:
                await resp.read()
                return resp.status

        async def tunnel() -> str:
            async with session.ws_connect(gw.url.replace("http://", "ws://") + "/ws") as ws:
                await ws.send_str("hi")
                return (await ws.receive_str()) + str(await ws.close())

        assert await call("/rejected") == 200
        # 12 at a time, on kept-alive connections: proxied (with and without a body), limited,
        # 502, rejected, returned; then WebSocket tunnels
        calls = [("/echo", None), ("/echo", b"x" * 3000), ("/limited/echo", None), ("/dead", None)]
        calls += [("/rejected", None), ("/nowhere", None)]
        for _ in range(250):
            statuses = await asyncio.gather(*(call(path, body) for path, body in calls * 2))
            assert statuses == [200, 200, 200, 502, 503, 404] * 2
        for _ in range(80):
            assert await asyncio.gather(*(tunnel() for _ in range(5))) == ["echo:hiTrue"] * 5
    after = await scrape(url)
    # 3,000 requests and 400 tunnels: a cycle per request (10 objects each) would be 30,000
    # here, and even 2 objects per request cross the young generation's threshold (2,000)
    assert collected(after) - collected(before) < 500, (before, after)
