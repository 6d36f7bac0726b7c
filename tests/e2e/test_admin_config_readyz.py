"""GET /config (secrets redacted) and GET /readyz (serving by its policy, not shutting down)."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Callable

import aiohttp

from tests.support.config import config as support_config
from tests.support.http import get
from tests.support.ports import free_port
from tests.support.upstreams import Upstream

ADMIN_TOKEN = "adm-Tok3n-never-shown"
REDIS_PASSWORD = "hunter2-Redis-pw"


ROUTE = """    limit_req: [{zone: tokens, burst: 5}]
    proxy_set_header: {X-Api-Token: upstream-Secret-value}
    add_header: [{name: X-Secret, value: added-Secret-value}]"""


def config(
    upstream: Upstream, admin: int, redis_url: str, extra: str = "", on_error: str = "local"
) -> Callable[[int], str]:
    return support_config(
        upstream,
        admin=admin,
        token=ADMIN_TOKEN,
        top=f'shutdown_timeout: 5s\nstore:\n  redis: {{url: "{redis_url}", timeout: 100ms, on_error: {on_error}, prefix: "t:"}}',
        zones="  tokens: {type: req, key: $binary_remote_addr, rate: 10r/s}",
        route=ROUTE,
        extra=extra,
    )


async def admin_get(admin: int, path: str, token: str | None = ADMIN_TOKEN) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    reply = await get(f"http://127.0.0.1:{admin}{path}", headers=headers)
    return reply.status, reply.text


async def test_config_is_the_active_config_with_secrets_redacted(gateway_factory, upstream, redis_server):
    admin = free_port()
    url = f"redis://default:{REDIS_PASSWORD}@127.0.0.1:{redis_server.port}/0?password={REDIS_PASSWORD}"
    gw = gateway_factory(config(upstream, admin, url))
    assert (await admin_get(admin, "/config", token=None))[0] == 401
    status, text = await admin_get(admin, "/config")
    assert status == 200
    for secret in (REDIS_PASSWORD, ADMIN_TOKEN, "upstream-Secret-value", "added-Secret-value"):
        assert secret not in text
    body = json.loads(text)
    assert body["listen"] == [{"host": "127.0.0.1", "port": gw.port, "ssl": False, "proxy_protocol": False}]
    assert body["admin"]["token"] == "REDACTED"
    assert body["store"]["redis"]["url"] == f"redis://REDACTED@127.0.0.1:{redis_server.port}/0?password=REDACTED"
    assert body["store"]["redis"]["prefix"] == "t:"
    assert body["zones"]["tokens"]["type"] == "req"  # a zone named "tokens" is not a secret
    # the active config: after a reload, /config shows the new one
    gw.write_config(config(upstream, admin, url, "server_tokens: on\n")(gw.port))
    gw.reload()
    body = json.loads((await admin_get(admin, "/config"))[1])
    assert body["edge"]["server_tokens"] is True


async def test_readyz_is_ready_while_the_node_serves_by_its_policy_and_not_while_shutting_down(
    gateway_factory, upstream, redis_server
):
    redis = redis_server
    admin = free_port()
    gw = gateway_factory(config(upstream, admin, f"redis://127.0.0.1:{redis.port}"))
    status, text = await admin_get(admin, "/readyz", token=None)
    assert (status, json.loads(text)) == (200, {"ready": True, "redis": "up", "on_error": "local"})
    redis.kill()
    # on_error: local keeps serving and limiting: still ready (a load balancer must not drain every node)
    status, text = await admin_get(admin, "/readyz", token=None)
    body = json.loads(text)
    assert status == 200 and body["ready"] is True and body["redis"] == "down", body
    assert "Redis is unreachable" in body["reason"] and "on_error: local" in body["reason"]
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/served") as resp:
            assert resp.status == 200
    redis.restart()
    for _ in range(100):
        if json.loads((await admin_get(admin, "/readyz", token=None))[1]).get("redis") == "up":
            break
        await asyncio.sleep(0.1)
    assert (await admin_get(admin, "/readyz", token=None))[0] == 200
    # while draining a slow request on SIGTERM, the node says it is not ready
    async with aiohttp.ClientSession() as session:
        slow = asyncio.ensure_future(session.get(gw.url + "/slow?ms=2000"))
        await asyncio.sleep(0.3)
        gw.signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        status, text = await admin_get(admin, "/readyz", token=None)
        assert status == 503 and "shutting down" in json.loads(text)["reason"]
        assert (await slow).status == 200


async def test_readyz_is_not_ready_when_redis_is_down_and_on_error_denies(gateway_factory, upstream, redis_server):
    admin = free_port()
    gateway_factory(config(upstream, admin, f"redis://127.0.0.1:{redis_server.port}", on_error="deny"))
    status, text = await admin_get(admin, "/readyz", token=None)
    assert (status, json.loads(text)) == (200, {"ready": True, "redis": "up", "on_error": "deny"})
    redis_server.kill()
    status, text = await admin_get(admin, "/readyz", token=None)
    body = json.loads(text)
    assert status == 503 and body["ready"] is False and body["redis"] == "down", body
    assert "on_error is deny" in body["reason"]
