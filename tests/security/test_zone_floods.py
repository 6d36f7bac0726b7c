"""Zones under attack: floods of long unique keys, and IPv6 clients rotating through a /64.

Issue 8: unique ~1 KB keys made a full zone answer 503 "could not allocate node" to
new clients, and a host owning a /64 escaped per-address limits by changing address.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import aiohttp
import pytest
import redis
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.http.context import RequestContext
from gateway.http.realip import parse_addr
from gateway.limits import nginx_req
from gateway.plan import load_config_text
from gateway.store.memory import ENTRY_COST, MemoryStore
from tests.support.config import config
from tests.support.ports import free_port
from tests.support.upstreams import Upstream

ZONE_SIZE = 1 << 20


def flood_config(port: int, upstream: str, admin_port: int, store: str = "") -> str:
    return config(
        upstream,
        top=f"shutdown_timeout: 3s\nlog: {{access: off}}\n{store}",
        admin=admin_port,
        token="flood",
        zones="  by_key: {type: req, key: $http_x_key, rate: 1r/m, size: 1m}",
        upstream_options="read_timeout: 5s",
        route="    limit_req: [{zone: by_key, burst: 5, nodelay: true}]",
    )(port)


def unique_key(i: int) -> str:
    """Unique per i, 900 to 1100 bytes: keys of varied length are what defeated nginx's rule."""
    return (f"{i:016x}" * 70)[: 900 + (i * 7919) % 201]


# -- the store, through the compiled key extractor ---------------------------------------------


def test_200k_unique_1kb_keys_never_fail_and_the_zone_stays_within_size():
    compiled = load_config_text(flood_config(8080, "127.0.0.1:9", 9180))
    route = compiled.routes[0]
    limit = route.limit_req[0]
    clock = [10**9]
    store = MemoryStore(clock_ms=lambda: clock[0])
    store.configure(compiled.spec.zones)
    zone = store.zones["by_key"]
    peer = parse_addr("192.0.2.1")
    assert peer is not None
    ctx = RequestContext(make_mocked_request("GET", "/"), 0.0, peer, "http", 80)
    outcomes = {nginx_req.OK: 0, nginx_req.ERROR: 0, nginx_req.BUSY: 0}
    longest = 0
    for i in range(200_000):
        clock[0] += 1  # keys stay recent and charged: none is ever idle enough to expire
        ctx.headers = CIMultiDictProxy(CIMultiDict({"X-Key": unique_key(i)}))
        key = limit.key(ctx)
        longest = max(longest, len(key))
        verdict = store.decide(route, [key], [], [])
        assert verdict.req is not None
        outcomes[verdict.req.rc] += 1
        assert zone.used <= ZONE_SIZE
    assert outcomes == {nginx_req.OK: 200_000, nginx_req.ERROR: 0, nginx_req.BUSY: 0}
    assert longest == 17  # each ~1 KB key reached the store as 17 bytes
    assert len(zone) == ZONE_SIZE // (ENTRY_COST + 17)  # the zone is full, and full of live keys


# -- end to end through the CLI-started gateway ---------------------------------------------------


async def _flood(url: str, count: int, start: int, connections: int = 8) -> dict[int, int]:
    statuses: dict[int, int] = {}
    next_i = iter(range(start, start + count))

    async def client() -> None:
        async with aiohttp.ClientSession() as session:
            for i in next_i:
                async with session.get(url, headers={"X-Key": unique_key(i)}) as resp:
                    await resp.read()
                    statuses[resp.status] = statuses.get(resp.status, 0) + 1

    await asyncio.gather(*(client() for _ in range(connections)))
    return statuses


async def _zone_status(admin_port: int) -> dict[str, int]:
    async with aiohttp.ClientSession() as session:
        headers = {"Authorization": "Bearer flood"}
        async with session.get(f"http://127.0.0.1:{admin_port}/status", headers=headers) as resp:
            body = json.loads(await resp.text())
    return body["zones"]["by_key"]  # type: ignore[no-any-return]


@pytest.mark.slow
async def test_a_flood_of_unique_1kb_keys_through_the_gateway_gets_no_503(gateway_factory, upstream):
    admin_port = free_port()
    gw = gateway_factory(lambda port: flood_config(port, upstream.address, admin_port))
    statuses = await _flood(gw.url + "/echo", 12_000, 0)
    assert statuses == {200: 12_000}, statuses
    zone = await _zone_status(admin_port)
    assert zone["bytes"] <= zone["size"] == ZONE_SIZE
    assert zone["keys"] == ZONE_SIZE // (ENTRY_COST + 17)  # full: the flood evicted LRU keys to get in
    # the defence did not cost the limit its teeth: a repeated key is still limited
    async with aiohttp.ClientSession() as session:
        codes = []
        for _ in range(7):
            async with session.get(gw.url + "/echo", headers={"X-Key": unique_key(11_999)}) as resp:
                codes.append(resp.status)
    assert codes.count(503) >= 1, codes
    assert "could not allocate node" not in gw.stderr()


@pytest.mark.slow
async def test_workers_send_the_shared_store_hashed_keys(gateway_factory, upstream):
    admin_port = free_port()
    gw = gateway_factory(lambda port: flood_config(port, upstream.address, admin_port, "workers: 2"))
    statuses = await _flood(gw.url + "/echo", 300, 0, connections=4)
    assert statuses == {200: 300}
    zone = await _zone_status(admin_port)  # the master's store, which every worker asks
    assert zone["keys"] == 300
    assert zone["bytes"] == 300 * (ENTRY_COST + 17)


# -- IPv6 clients rotating inside their /64 ----------------------------------------------------------


V6_ZONES = """  per64: {type: req, key: $binary_remote_addr, rate: 1r/m, ipv6_prefix: 64}
  per128: {type: req, key: $binary_remote_addr, rate: 1r/m}
  text64: {type: count, key: $remote_addr, limit: 1, window: 1m, ipv6_prefix: 64}
  banned64: {type: req, key: $binary_remote_addr, rate: 1r/m, ban: 1h, ipv6_prefix: 64}"""
V6_ROUTES = """  - {location: /p64, upstream: app, limit_req: [{zone: per64, nodelay: true}]}
  - {location: /p128, upstream: app, limit_req: [{zone: per128, nodelay: true}]}
  - {location: /count64, upstream: app, limit_count: [{zone: text64}]}
  - {location: /ban64, upstream: app, limit_req: [{zone: banned64, nodelay: true}]}"""


def v6_config(port: int, upstream: Upstream, store: str = "") -> str:
    top = f"shutdown_timeout: 3s\nlog: {{access: off}}\nreal_ip: {{from: [127.0.0.1/32], header: X-Real-IP}}\n{store}"
    return config(
        upstream, top=top, admin="{listen: off}", zones=V6_ZONES, upstream_options="read_timeout: 5s", routes=V6_ROUTES
    )(port)


async def _status(session: aiohttp.ClientSession, url: str, client: str) -> int:
    async with session.get(url, headers={"X-Real-IP": client}) as resp:
        await resp.read()
        return resp.status


async def _check_prefix_sharing(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        # /64: a second address of the same /64 finds the bucket used up; another /64 does not
        assert await _status(session, url + "/p64", "2001:db8:1:2::1") == 200
        assert await _status(session, url + "/p64", "2001:db8:1:2:dead:beef:0:7") == 503
        assert await _status(session, url + "/p64", "2001:db8:1:3::1") == 200
        # /128: every address is its own client, as in nginx
        assert await _status(session, url + "/p128", "2001:db8:1:2::1") == 200
        assert await _status(session, url + "/p128", "2001:db8:1:2::2") == 200
        assert await _status(session, url + "/p128", "2001:db8:1:2::2") == 503
        # $remote_addr text in a count zone is masked the same way
        assert await _status(session, url + "/count64", "2001:db8:9:9::a") == 200
        assert await _status(session, url + "/count64", "2001:db8:9:9::b") == 429
        # IPv4 clients are never grouped, whatever ipv6_prefix says
        assert await _status(session, url + "/p64", "198.51.100.1") == 200
        assert await _status(session, url + "/p64", "198.51.100.2") == 200
        assert await _status(session, url + "/count64", "198.51.100.1") == 200
        assert await _status(session, url + "/count64", "198.51.100.2") == 200
        # the attack: overflow once, then rotate through fresh addresses of the /64
        assert await _status(session, url + "/ban64", "2001:db8:66:1::1") == 200
        assert await _status(session, url + "/ban64", "2001:db8:66:1::1") == 503  # banned for 1h
        for host in range(2, 12):
            assert await _status(session, url + "/ban64", f"2001:db8:66:1:{host:x}:{host:x}::{host:x}") == 503


async def test_two_addresses_of_one_64_share_a_limit_with_the_memory_store(gateway_factory, upstream):
    gw = gateway_factory(lambda port: v6_config(port, upstream))
    await _check_prefix_sharing(gw.url)


def _redis_keys(url: str, prefix: str) -> list[bytes]:
    client = redis.Redis.from_url(url)
    try:
        return list(client.keys(prefix + "*"))
    finally:
        client.close()


async def test_two_addresses_of_one_64_share_a_limit_with_the_redis_store(gateway_factory, upstream, redis_session):
    prefix = f"t{uuid.uuid4().hex[:10]}:"
    store = f'store:\n  redis: {{url: "{redis_session.url}", timeout: 500ms, on_error: deny, prefix: "{prefix}"}}'
    gw = gateway_factory(lambda port: v6_config(port, upstream, store))
    await _check_prefix_sharing(gw.url)
    keys = _redis_keys(redis_session.url, prefix)
    masked = bytes.fromhex("20010db8000100020000000000000000")
    assert any(k.endswith(b"per64:" + masked) for k in keys), keys


async def test_long_keys_reach_redis_hashed(gateway_factory, upstream, redis_session):
    prefix = f"t{uuid.uuid4().hex[:10]}:"
    store = f'store:\n  redis: {{url: "{redis_session.url}", timeout: 500ms, on_error: deny, prefix: "{prefix}"}}'
    gw = gateway_factory(lambda port: flood_config(port, upstream.address, free_port(), store))
    statuses = await _flood(gw.url + "/echo", 200, 0, connections=4)
    assert statuses == {200: 200}
    keys = _redis_keys(redis_session.url, prefix)
    zone_keys = [k for k in keys if b"by_key:" in k]
    assert len(zone_keys) == 200
    assert {len(k.split(b"by_key:", 1)[1]) for k in zone_keys} == {17}
