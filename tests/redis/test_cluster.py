"""Several gateway processes sharing one Redis, through the real CLI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable

import aiohttp
import pytest
import redis

from tests.support.config import config
from tests.support.paths import ROOT
from tests.support.upstreams import Upstream

pytestmark = pytest.mark.slow


def node_config(
    upstream: Upstream,
    redis_url: str,
    prefix: str,
    *,
    on_error: str = "local",
    extra: str = "",
    timeout: str = "100ms",
    zones: str = "",
    route: str = "",
) -> Callable[[int], str]:
    top = (
        "shutdown_timeout: 3s\nlog: {format: json}\nbans: {sync_interval: 1s}\n"
        f'store:\n  redis: {{url: "{redis_url}", timeout: {timeout}, on_error: {on_error}, prefix: "{prefix}"}}'
    )
    return config(
        upstream,
        top=top,
        admin="{listen: off}",
        zones=zones or "  per_key: {type: req, key: $arg_k, rate: 5r/s, ban: 0}",
        upstream_options="read_timeout: 5s",
        route=route or "    limit_req: [{zone: per_key, burst: 2, nodelay: true}]",
        extra=extra,
    )


async def status_of(session: aiohttp.ClientSession, url: str) -> int:
    async with session.get(url) as resp:
        await resp.read()
        return resp.status


async def play(urls: list[str], schedule_ms: list[int], path: str) -> list[int]:
    """Send one request per scheduled instant, spreading them over ``urls`` in turn."""
    start = time.monotonic()
    results: list[int] = [0] * len(schedule_ms)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(i: int, at: int) -> None:
            await asyncio.sleep(max(0.0, start + at / 1000 - time.monotonic()))
            results[i] = await status_of(session, urls[i % len(urls)] + path)

        await asyncio.gather(*(one(i, at) for i, at in enumerate(schedule_ms)))
    return results


@pytest.mark.timing
async def test_three_nodes_admit_what_one_node_admits(gateway_factory, upstream, redis_session):
    prefix = f"acc{uuid.uuid4().hex[:6]}:"
    nodes = [gateway_factory(node_config(upstream, redis_session.url, prefix)) for _ in range(3)]
    single = gateway_factory(node_config(upstream, redis_session.url, prefix + "single:"))
    schedule = [i * 40 for i in range(75)]  # 25 req/s for 3 s against 5r/s, burst 2
    spread, alone = await asyncio.gather(
        play([n.url for n in nodes], schedule, "/echo?k=client"),
        play([single.url], schedule, "/echo?k=client"),
    )
    admitted_spread = spread.count(200)
    admitted_alone = alone.count(200)
    assert abs(admitted_spread - admitted_alone) <= 1, (admitted_spread, admitted_alone)
    assert 15 <= admitted_alone <= 20  # burst 3 at once, then 5 per second
    assert set(spread) == {200, 503}
    # each node really served part of the traffic
    assert all(any(e["status"] == 200 for e in n.access_json()) for n in nodes)


@pytest.mark.timing
async def test_a_manual_ban_reaches_every_node_within_a_second(gateway_factory, upstream, redis_session, tmp_path):
    prefix = f"ban{uuid.uuid4().hex[:6]}:"
    make = node_config(upstream, redis_session.url, prefix)
    nodes = [gateway_factory(make) for _ in range(3)]
    conf = nodes[0].config_path
    async with aiohttp.ClientSession() as session:
        assert [await status_of(session, n.url + "/echo") for n in nodes] == [200, 200, 200]

        async def time_until(status: int) -> float:
            started = time.monotonic()
            pending = {n.url for n in nodes}
            while pending and time.monotonic() - started < 5:
                for url in list(pending):
                    if await status_of(session, url + "/echo") == status:
                        pending.discard(url)
                await asyncio.sleep(0.005)
            assert not pending, f"nodes still not answering {status}: {pending}"
            return time.monotonic() - started

        cli = [sys.executable, "-m", "gateway"]
        banned = subprocess.run(
            cli + ["ban", "127.0.0.1", "--for", "10m", "--reason", "e2e", "-c", str(conf)],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert banned.returncode == 0, banned.stderr
        propagation = await time_until(403)
        listed = subprocess.run(cli + ["bans", "--json", "-c", str(conf)], capture_output=True, text=True, cwd=ROOT)
        assert [b["target"] for b in json.loads(listed.stdout)] == ["127.0.0.1/32"]
        unbanned = subprocess.run(
            cli + ["unban", "127.0.0.1", "-c", str(conf)], capture_output=True, text=True, cwd=ROOT
        )
        assert unbanned.returncode == 0, unbanned.stderr
        lifted = await time_until(200)
    print(f"ban propagation to 3 nodes: {propagation * 1000:.0f} ms; unban: {lifted * 1000:.0f} ms")
    assert propagation < 1.0 and lifted < 1.0


@pytest.mark.timing
async def test_an_automatic_ban_holds_on_every_node(gateway_factory, upstream, redis_session):
    prefix = f"auto{uuid.uuid4().hex[:6]}:"
    make = node_config(
        upstream,
        redis_session.url,
        prefix,
        zones="  per_key: {type: req, key: $arg_k, rate: 1r/s, ban: 2s}",
        route="    limit_req: [{zone: per_key}]",
    )
    a, b = gateway_factory(make), gateway_factory(make)
    async with aiohttp.ClientSession() as session:
        assert await status_of(session, a.url + "/echo?k=abuser") == 200
        assert await status_of(session, a.url + "/echo?k=abuser") == 503  # overflow: banned for 2 s
        for i in range(5):
            assert await status_of(session, b.url + "/echo?k=abuser") == 503
            assert await status_of(session, b.url + f"/echo?k=someone{i}") == 200  # only that key
        await asyncio.sleep(2.2)
        assert await status_of(session, b.url + "/echo?k=abuser") == 200
    assert "banned for 2s" in a.stderr()


@pytest.mark.timing
@pytest.mark.parametrize("policy", ["local", "allow", "deny"])
async def test_redis_killed_and_restarted_under_load(gateway_factory, upstream, redis_server, policy):
    prefix = f"f{uuid.uuid4().hex[:6]}:"
    gw = gateway_factory(
        node_config(
            upstream,
            redis_server.url,
            prefix,
            on_error=policy,
            timeout="50ms",
            zones="  per_key: {type: req, key: $arg_k, rate: 2r/s}\n  conns: {type: conn, key: $arg_k}",
            route="    limit_req: [{zone: per_key, burst: 5, nodelay: true}]\n    limit_conn: [{zone: conns, max: 50}]",
        )
    )
    phases: dict[str, list[tuple[int, float]]] = {"before": [], "down": [], "after": []}
    phase = "before"
    stop = asyncio.Event()

    async def client(n: int) -> None:
        async with aiohttp.ClientSession() as session:
            while not stop.is_set():
                started, started_in = time.monotonic(), phase  # a request counts where it began
                try:
                    async with session.get(gw.url + f"/echo?k=c{n % 3}", timeout=aiohttp.ClientTimeout(total=5)) as r:
                        await r.read()
                        status = r.status
                except (TimeoutError, aiohttp.ClientError):
                    status = 0
                phases[started_in].append((status, time.monotonic() - started))
                await asyncio.sleep(0.01)

    clients = [asyncio.ensure_future(client(n)) for n in range(6)]
    await asyncio.sleep(1.0)
    redis_server.kill()
    phase = "down"  # only requests sent once Redis is gone
    await asyncio.sleep(1.5)
    redis_server.restart()
    restarted = time.monotonic()
    phase = "after"
    recovered_at = None
    client_redis = redis.Redis(port=redis_server.port)
    while time.monotonic() - restarted < 3 and recovered_at is None:
        if client_redis.exists(f"{prefix}per_key:c0", f"{prefix}per_key:c1", f"{prefix}per_key:c2"):
            recovered_at = time.monotonic()
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.gather(*clients)
    await asyncio.sleep(0.3)

    everything = [r for p in phases.values() for r in p]
    assert all(status != 0 for status, _ in everything), "a request failed or hung"
    slowest = max(latency for _, latency in everything)
    assert slowest < 0.5, f"slowest request {slowest:.3f}s with Redis down ({policy})"
    down = [status for status, _ in phases["down"]]
    if policy == "local":
        assert 200 in down and 503 in down  # still limited, by the node itself
    elif policy == "allow":
        assert set(down[5:]) == {200}  # let through
    else:
        assert down.count(503) > len(down) // 2  # refused
    assert recovered_at is not None and recovered_at - restarted < 1.0, "Redis not used again within 1 s"
    # State in Redis is well-formed, and no limit_conn lease was left behind.
    state = json.loads(client_redis.get(f"{prefix}per_key:c0") or b"[0,0,0]")
    assert len(state) == 3 and 0 <= state[0] <= 6000 and state[2] == 0
    assert sum(client_redis.zcard(k) for k in client_redis.keys(f"{prefix}conns:*")) == 0
    client_redis.close()
