"""The admin API and the operator commands against a running gateway (embedded store)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import aiohttp

from tests.support.config import config as support_config
from tests.support.gateway import cli
from tests.support.http import status
from tests.support.ports import free_port
from tests.support.upstreams import Upstream

ZONES = "  one: {type: req, key: $binary_remote_addr, rate: 100r/s}"
ROUTES = "  - {location: /, upstream: app, limit_req: [{zone: one, burst: 100}]}"


def config(upstream: Upstream, admin_port: int, extra: str = "") -> Callable[[int], str]:
    return support_config(upstream, admin=admin_port, token="s3cret", zones=ZONES, routes=ROUTES, extra=extra)


async def test_admin_api_needs_the_token_and_reports_status(gateway_factory, upstream):
    admin = free_port()
    gw = gateway_factory(config(upstream, admin))
    assert await status(gw.url + "/echo") == 200
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{admin}/status") as resp:
            assert resp.status == 401
        headers = {"Authorization": "Bearer s3cret"}
        async with session.get(f"http://127.0.0.1:{admin}/status", headers=headers) as resp:
            body = await resp.json()
    assert body["store"] == "memory" and body["routes"] == 1
    assert body["zones"]["one"]["keys"] == 1 and body["zones"]["one"]["size"] == 10 * 1024 * 1024


async def test_ban_unban_and_bans_through_the_cli(gateway_factory, upstream):
    admin = free_port()
    gw = gateway_factory(config(upstream, admin))
    conf = str(gw.config_path)
    banned = cli("ban", "127.0.0.0/8", "--for", "1h", "--reason", "scraping", "--force", "-c", conf)
    assert banned.returncode == 0, banned.stderr
    assert await status(gw.url + "/echo") == 403
    listed = json.loads(cli("bans", "--json", "-c", conf).stdout)
    assert [(b["target"], b["reason"]) for b in listed] == [("127.0.0.0/8", "scraping")]
    assert 3590 < listed[0]["remaining_s"] <= 3600
    assert "127.0.0.0/8" in cli("bans", "-c", conf).stdout
    assert cli("unban", "127.0.0.0/8", "-c", conf).returncode == 0
    assert await status(gw.url + "/echo") == 200
    assert cli("unban", "127.0.0.0/8", "-c", conf).returncode == 1  # not banned any more
    bad = cli("ban", "not-an-ip", "-c", conf)
    assert bad.returncode == 1 and "not an IP address or CIDR" in bad.stderr


async def test_reload_through_the_cli_reports_errors_and_keeps_serving(gateway_factory, upstream):
    admin = free_port()
    make = config(upstream, admin)
    gw = gateway_factory(make)
    conf = str(gw.config_path)
    done = cli("reload", "-c", conf)
    assert (done.returncode, done.stdout) == (0, "reloaded\n")
    gw.write_config(make(gw.port).replace("rate: 100r/s", "rate: 0r/s"))
    failed = cli("reload", "-c", conf)
    assert failed.returncode == 1
    assert "zones.one.rate: invalid rate" in failed.stderr
    assert await status(gw.url + "/echo") == 200


async def test_a_ban_reaches_every_worker_of_a_node(gateway_factory, upstream):
    admin = free_port()
    gw = gateway_factory(config(upstream, admin, "workers: 3\n"))
    deadline = time.monotonic() + 20
    while gw.stderr().count("listening on") < 3:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    assert cli("ban", "127.0.0.1", "-c", str(gw.config_path)).returncode == 0
    await asyncio.sleep(0.2)
    for _ in range(12):  # fresh connections: spread over the workers
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            async with session.get(gw.url + "/echo") as resp:
                assert resp.status == 403
