"""GET / DELETE /zones/<zone>/<key> and `gateway zone show|reset`, on the embedded store
(one process, and a master with workers) and on Redis."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import aiohttp
import pytest

from tests.support.config import config
from tests.support.gateway import cli
from tests.support.http import request
from tests.support.ports import free_port
from tests.support.upstreams import Upstream

TOKEN = "s3cret"


ZONES = """  req: {type: req, key: $binary_remote_addr, rate: 1r/m}
  cnt: {type: count, key: $binary_remote_addr, limit: 5, window: 60s}
  slide: {type: count, key: $binary_remote_addr, limit: 5, window: 60s, window_type: sliding}
  cell: {type: gcra, key: $binary_remote_addr, rate: 1r/m, burst: 3}
  log: {type: sliding_log, key: $binary_remote_addr, limit: 5, window: 60s}
  bucket: {type: token, key: $binary_remote_addr, rate: 5r/s, max_delay: 300ms}
  long: {type: count, key: $http_x_user, limit: 9, window: 60s, max_key: 32}"""
ROUTE = """    limit_req: [{zone: req, burst: 10, nodelay: true}]
    limit_count: [{zone: cnt}, {zone: slide}, {zone: long}]
    limits: [{zone: cell}, {zone: log}, {zone: bucket}]"""


def every_zone_type(upstream: Upstream, admin: int, extra: str = "") -> Callable[[int], str]:
    return config(upstream, admin=admin, token=TOKEN, zones=ZONES, route=ROUTE, extra=extra)


async def send(url: str, n: int, user: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            async with session.get(url + "/echo", headers={"X-User": user}) as resp:
                assert resp.status == 200, await resp.text()


async def call(admin: int, method: str, path: str, **kw) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {TOKEN}", **kw.pop("headers", {})}
    reply = await request(method, f"http://127.0.0.1:{admin}{path}", headers=headers, **kw)
    return reply.status, reply.json()


async def check_zone_state(gw, admin: int) -> None:
    user = "u" * 100  # longer than max_key: 32, stored hashed
    await send(gw.url, 2, user)
    status, req = await call(admin, "GET", "/zones/req/127.0.0.1")
    assert status == 200 and req["type"] == "req" and req["key"] == "127.0.0.1"
    assert 0.9 < req["excess"] <= 1.0 and req["banned_for_ms"] == 0, json.dumps(
        req
    )  # 2 requests at 1r/m: one over the rate
    status, cnt = await call(admin, "GET", "/zones/cnt/127.0.0.1")
    assert (status, cnt["used"], cnt["remaining"]) == (200, 2, 3) and 0 < cnt["reset_in_ms"] <= 60_000
    assert (await call(admin, "GET", "/zones/slide/127.0.0.1"))[1]["remaining"] == 3
    assert (await call(admin, "GET", "/zones/log/127.0.0.1"))[1]["remaining"] == 3
    status, cell = await call(admin, "GET", "/zones/cell/127.0.0.1")
    assert status == 200 and cell["type"] == "gcra"
    assert (await call(admin, "GET", "/zones/bucket/127.0.0.1"))[0] == 200
    status, long = await call(admin, "GET", f"/zones/long/{user}")
    assert (status, long["remaining"]) == (200, 7)
    # absent key, unknown zone, a key that is not an address
    assert (await call(admin, "GET", "/zones/cnt/192.0.2.9"))[0] == 404
    status, body = await call(admin, "GET", "/zones/nope/127.0.0.1")
    assert status == 404 and "unknown zone" in body["error"]
    assert (await call(admin, "GET", "/zones/cnt/not-an-ip"))[0] == 400
    # the token is required; DELETE needs the JSON content type like every mutation
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{admin}/zones/cnt/127.0.0.1") as resp:
            assert resp.status == 401
    status, _ = await call(admin, "DELETE", "/zones/cnt/127.0.0.1", data="{}", headers={"Content-Type": "text/plain"})
    assert status == 415
    status, body = await call(admin, "DELETE", "/zones/cnt/127.0.0.1", json={})
    assert (status, body["reset"]) == (200, True)
    assert (await call(admin, "GET", "/zones/cnt/127.0.0.1"))[0] == 404
    assert (await call(admin, "DELETE", "/zones/cnt/127.0.0.1", json={}))[0] == 404
    # the CLI
    conf = str(gw.config_path)
    shown = cli("zone", "show", "req", "127.0.0.1", "-c", conf)
    assert shown.returncode == 0 and json.loads(shown.stdout)["zone"] == "req"
    reset = cli("zone", "reset", "req", "127.0.0.1", "-c", conf)
    assert (reset.returncode, reset.stdout) == (0, "reset 127.0.0.1 in zone req\n")
    missing = cli("zone", "show", "req", "127.0.0.1", "-c", conf)
    assert missing.returncode == 1 and "no state for '127.0.0.1' in zone 'req'" in missing.stderr
    await send(gw.url, 1, user)
    # every zone type was decided (with workers, by the master's shared store), none failed open
    assert "limit store unavailable" not in gw.stderr() and "cannot decide" not in gw.stderr()


async def wait_workers(gw, n: int) -> None:
    deadline = time.monotonic() + 20
    while gw.stderr().count("listening on") < n:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("workers", [1, 2])
async def test_zone_state_on_the_embedded_store(gateway_factory, upstream, workers):
    admin = free_port()
    gw = gateway_factory(every_zone_type(upstream, admin, f"workers: {workers}\n"))
    await wait_workers(gw, workers)
    await check_zone_state(gw, admin)


@pytest.mark.parametrize("workers", [1, 2])
async def test_zone_state_on_redis(gateway_factory, upstream, redis_server, workers):
    redis_server.command("FLUSHALL")
    admin = free_port()
    store = f'store: {{redis: {{url: "redis://127.0.0.1:{redis_server.port}", prefix: "zs:", timeout: 1s}}}}\n'
    gw = gateway_factory(every_zone_type(upstream, admin, f"workers: {workers}\n{store}"))
    await wait_workers(gw, workers)
    await check_zone_state(gw, admin)
    # reset deleted the key the script wrote: the one request since counts from 1 again
    value = redis_server.command("GET", "zs:cnt:\x7f\x00\x00\x01")
    assert value.split(":")[0] == "1", value
