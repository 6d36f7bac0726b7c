"""Ban lists at the scale of real blocklists (100,000 entries), through the real CLI and real nodes."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.bans.redis import RedisBans
from gateway.bans.table import Ban, BanList
from gateway.clock import epoch_ms
from tests.support.ban_lists import FREE_V4, FREE_V6, mixed_blocklist, samples
from tests.support.config import config
from tests.support.gateway import cli
from tests.support.ports import free_port
from tests.support.upstreams import Upstream

pytestmark = [pytest.mark.slow]

TOKEN = "scale-token-0123456789"
N = 100_000


def node_config(
    upstream: Upstream, admin_port: int, *, redis_url: str = "", prefix: str = "", extra: str = ""
) -> Callable[[int], str]:
    store = f'store:\n  redis: {{url: "{redis_url}", timeout: 50ms, prefix: "{prefix}"}}' if redis_url else ""
    top = f'log: {{access: off}}\nreal_ip: {{from: [127.0.0.1, "::1"], header: X-Real-IP}}\nbans: {{sync_interval: 1s}}\n{store}'
    return config(upstream, admin=admin_port, token=TOKEN, top=top, extra=extra)


async def node_status(session: aiohttp.ClientSession, admin_port: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with session.get(f"http://127.0.0.1:{admin_port}/status", headers=headers) as resp:
        body: dict[str, Any] = await resp.json()
        return body


async def banned_count(session: aiohttp.ClientSession, admin_port: int) -> int:
    return int((await node_status(session, admin_port))["bans"])


async def status_as(session: aiohttp.ClientSession, url: str, client: str) -> int:
    async with session.get(url + "/echo", headers={"X-Real-IP": client}) as resp:
        await resp.read()
        return resp.status


async def wait_enforced(nodes: list[tuple[str, int]], count: int, probes: list[str], deadline: float) -> None:
    """Until every node reports ``count`` bans and answers 403 to every probe address."""
    async with aiohttp.ClientSession() as session:
        pending = list(nodes)
        seen: tuple[Any, list[int]] = (0, [])
        while pending:
            assert time.monotonic() < deadline, f"not enforced in time on {pending}: {seen}"
            url, admin = pending[0]
            status = await node_status(session, admin)
            seen = (status.get("ban_list"), [])
            if status["bans"] == count:
                statuses = [await status_as(session, url, addr) for addr in probes]
                seen = (count, statuses)
                if set(statuses) == {403}:
                    pending.pop(0)
                    continue
            await asyncio.sleep(0.05)


def budget(seconds: float) -> float:
    """The target on an idle machine; on a shared one already busier than its cores, the same
    target scaled by how much busier (at most 3 times), so that others' load is not our failure."""
    busy = os.getloadavg()[0] / (os.cpu_count() or 1)
    return seconds * min(3.0, max(1.0, busy))


def write_list(tmp_path: Path, targets: list[str]) -> Path:
    path = tmp_path / "blocklist.txt"
    path.write_text("# a feed\n\n" + "\n".join(targets) + "\n")
    return path


async def test_100k_bans_reach_three_nodes_within_10s_of_the_command(
    gateway_factory, upstream, redis_session, tmp_path
):
    prefix = f"scale{uuid.uuid4().hex[:6]}:"
    admins = [free_port() for _ in range(3)]
    nodes = [gateway_factory(node_config(upstream, a, redis_url=redis_session.url, prefix=prefix)) for a in admins]
    targets = mixed_blocklist(N)
    blocklist = write_list(tmp_path, targets)
    probes = samples(targets)
    async with aiohttp.ClientSession() as session:
        assert {await status_as(session, nodes[0].url, p) for p in probes} == {200}
    allowed = budget(10)
    started = time.monotonic()
    done = await asyncio.to_thread(
        cli, "ban", "--file", str(blocklist), "--for", "1d", "--reason", "feed", "-c", str(nodes[0].config_path)
    )
    command_s = time.monotonic() - started
    print(f"the command took {command_s:.2f} s")
    assert done.returncode == 0, done.stderr
    assert f"banned {N} addresses and networks for 1d" in done.stdout
    await wait_enforced([(n.url, a) for n, a in zip(nodes, admins, strict=True)], N, probes, started + allowed)
    elapsed = time.monotonic() - started
    print(
        f"100k bans on 3 nodes: command {command_s:.2f} s, enforced everywhere {elapsed:.2f} s (budget {allowed:.0f} s)"
    )
    async with aiohttp.ClientSession() as session:
        for node in nodes:  # nobody else is caught
            assert await status_as(session, node.url, FREE_V4) == 200
            assert await status_as(session, node.url, FREE_V6) == 200
    listed = cli(
        "bans", "--reason", "feed", "--match", "2001:db8::/32", "--limit", "5", "-c", str(nodes[1].config_path)
    )
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.strip().splitlines()[-1] == f"{N * 35 // 100} bans in force; shown 1-5"
    # unban the whole file: every node lets them through again
    lifted = await asyncio.to_thread(cli, "unban", "--file", str(blocklist), "-c", str(nodes[2].config_path))
    assert lifted.returncode == 0 and f"unbanned {N};" in lifted.stdout, lifted.stderr
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + 10
        for node, admin in zip(nodes, admins, strict=True):
            while await banned_count(session, admin):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            assert {await status_as(session, node.url, p) for p in probes} == {200}
    assert all("Traceback" not in n.stderr() for n in nodes)
    await drop_ban_keys(redis_session.url, prefix)


async def drop_ban_keys(url: str, prefix: str) -> None:
    """The session's redis-server is shared: leave it as light as we found it."""
    import redis.asyncio as aioredis

    from gateway.bans.redis import companion_keys

    key = f"{prefix}gateway:bans".encode()
    client = aioredis.Redis.from_url(url, socket_timeout=10)
    await client.unlink(key, *companion_keys(key))
    await client.aclose()


@pytest.mark.timing
async def test_a_node_started_against_100k_bans_enforces_them_within_5s_and_keeps_serving(
    gateway_factory, upstream, redis_session
):
    prefix = f"late{uuid.uuid4().hex[:6]}:"
    targets = mixed_blocklist(N, seed=7)
    import redis.asyncio as aioredis

    writer = aioredis.Redis.from_url(redis_session.url, socket_timeout=10)
    now = epoch_ms()
    await RedisBans(writer, prefix.encode(), BanList(), sync_interval_s=60).add_many(
        [Ban(t, now + 86_400_000, "feed", now, "test") for t in targets]
    )
    await writer.aclose()
    probes = samples(targets)
    # A control node on an empty list, serving the same traffic side by side: the machine's own
    # noise (CI runners and this machine are shared) hits both alike.
    control = gateway_factory(node_config(upstream, free_port(), redis_url=redis_session.url, prefix=prefix + "empty:"))
    admin = free_port()
    allowed = budget(5)
    started = time.monotonic()
    node = gateway_factory(node_config(upstream, admin, redis_url=redis_session.url, prefix=prefix))
    latencies: dict[str, list[float]] = {node.url: [], control.url: []}
    enforced = asyncio.Event()

    async def normal_traffic() -> None:
        async with aiohttp.ClientSession() as session:
            while not enforced.is_set():
                for url, times in latencies.items():
                    sent = time.monotonic()
                    assert await status_as(session, url, FREE_V4) == 200
                    times.append(time.monotonic() - sent)

    traffic = asyncio.ensure_future(normal_traffic())
    try:
        await wait_enforced([(node.url, admin)], N, probes, started + allowed)
        elapsed = time.monotonic() - started
    finally:
        enforced.set()
        await traffic
    during, beside = latencies[node.url], latencies[control.url]
    p99, control_p99 = percentile(during, 0.99), percentile(beside, 0.99)
    print(
        f"late node: 100k bans enforced {elapsed:.2f} s after start (budget {allowed:.0f} s); {len(during)} requests, "
        f"p50 {statistics.median(during) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max {max(during) * 1000:.1f} ms; "
        f"control node: p50 {statistics.median(beside) * 1000:.1f} ms, p99 {control_p99 * 1000:.1f} ms"
    )
    assert len(during) >= 50
    # Under 20 ms. On a machine too busy for that, the control node is the clock: its p99 is what
    # this machine's noise does to a node with nothing to load, so the loading node may be at most
    # twice that, plus 10 ms. A list built on the serving loop would stall it for the whole load
    # (seconds for 100k bans); no single answer may take half of the time to enforcement.
    assert p99 < 0.020 or p99 < 2 * control_p99 + 0.010, (p99, control_p99)
    assert max(during) < elapsed / 2, (max(during), elapsed)
    assert "could not bring the ban list up to date" not in node.stderr()
    await drop_ban_keys(redis_session.url, prefix)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


@pytest.mark.timing
async def test_100k_bans_through_the_admin_api_reach_every_worker(gateway_factory, upstream, tmp_path):
    admin = free_port()
    gw = gateway_factory(node_config(upstream, admin, extra="workers: 2\n"))
    deadline = time.monotonic() + 20
    while gw.stderr().count("listening on") < 2:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    targets = mixed_blocklist(N, seed=3)
    blocklist = write_list(tmp_path, targets)
    probes = samples(targets)
    allowed = budget(10)
    started = time.monotonic()
    done = await asyncio.to_thread(cli, "ban", "--file", str(blocklist), "--for", "0", "-c", str(gw.config_path))
    assert done.returncode == 0, done.stderr
    assert f"banned {N} addresses and networks until unbanned" in done.stdout
    async with aiohttp.ClientSession() as session:
        assert await banned_count(session, admin) == N
    # every worker: fresh connections land on either
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(4):
            for probe in probes:
                while await status_as(session, gw.url, probe) != 403:
                    assert time.monotonic() < started + allowed, probe
                    await asyncio.sleep(0.02)
        elapsed = time.monotonic() - started
        assert await status_as(session, gw.url, FREE_V4) == 200
    print(f"embedded store, 2 workers: 100k bans enforced {elapsed:.2f} s after the command")
    assert elapsed < allowed
    # a page as big as the whole list, while the node serves (built off the serving loop)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as session:
        url = f"http://127.0.0.1:{admin}/bans?limit=100000&match=2001:db8::/32"
        listing = asyncio.ensure_future(session.get(url, headers=headers))
        for _ in range(20):
            assert await status_as(session, gw.url, FREE_V4) == 200
        async with await listing as resp:
            page = await resp.json()
            assert resp.headers["X-Total-Count"] == str(N * 35 // 100) and len(page) == N * 35 // 100
