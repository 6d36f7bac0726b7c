"""A Redis without persistence dies and comes back empty: the nodes put the ban list back.

Two gateway nodes share one redis-server started with ``--save "" --appendonly no`` (the
``redis_server`` fixture). Bans go in through the CLI, some of them short; Redis is killed
and started again, empty, on the same port. Within 5 s every node refuses every address
whose ban has not ended, nothing that ended comes back, and an address unbanned before the
loss stays unbanned. The nodes say so in their error log and in ``gateway_bans_restored_total``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import aiohttp
import pytest

from tests.support.gateway import cli
from tests.support.ports import free_port
from tests.support.upstreams import Upstream

pytestmark = [pytest.mark.redis, pytest.mark.slow]

LONG = ["198.51.100.1", "198.51.100.2", "2001:db8::7", "203.0.113.0/24"]  # banned for an hour, or for ever
SHORT = ["192.0.2.10", "192.0.2.11"]  # banned for SHORT_S: ended before Redis comes back
SHORT_S = 6
UNBANNED = "198.51.100.9"  # banned, then unbanned before the loss


def node_config(upstream: Upstream, redis_url: str, prefix: str, metrics_port: int) -> object:
    def build(port: int) -> str:
        return f"""
listen: 127.0.0.1:{port}
shutdown_timeout: 2s
admin: {{listen: off}}
metrics: {{listen: 127.0.0.1:{metrics_port}}}
real_ip: {{from: [127.0.0.1], header: X-Real-IP}}
bans: {{sync_interval: 1s}}
store:
  redis: {{url: "{redis_url}", timeout: 200ms, on_error: local, prefix: "{prefix}"}}
upstreams:
  app: {{servers: [{upstream.address}]}}
routes:
  - {{location: /, upstream: app}}
"""

    return build


async def statuses(session: aiohttp.ClientSession, url: str, clients: list[str]) -> dict[str, int]:
    out = {}
    for client in clients:
        async with session.get(url + "/", headers={"X-Real-IP": client}) as resp:
            await resp.read()
            out[client] = resp.status
    return out


def probe(target: str) -> str:
    """One address inside a ban's target."""
    return target.replace("0/24", "77")


@pytest.mark.timing
async def test_a_node_puts_back_the_bans_redis_lost(gateway_factory, upstream, redis_server) -> None:
    prefix = f"restore{uuid.uuid4().hex[:6]}:"
    metrics_ports = [free_port(), free_port()]
    nodes = [gateway_factory(node_config(upstream, redis_server.url, prefix, m)) for m in metrics_ports]
    conf = str(nodes[0].config_path)
    assert cli("ban", UNBANNED, "--for", "1h", "-c", conf).returncode == 0
    for target in LONG[:2]:
        done = cli("ban", target, "--for", "1h", "--reason", f"abuse {target}", "-c", conf)
        assert done.returncode == 0, done.stderr
    for target in LONG[2:]:
        assert cli("ban", target, "--for", "0", "--reason", "for ever", "-c", conf).returncode == 0
    done = cli("ban", "--file", "-", "--for", f"{SHORT_S}s", "-c", conf, stdin="\n".join(SHORT) + "\n")
    assert done.returncode == 0, done.stderr
    listed = json.loads(cli("bans", "--json", "-c", conf).stdout)
    before = {item["target"]: item for item in listed}
    assert len(before) == len(LONG) + len(SHORT) + 1
    short_end_s = max(item["until_ms"] for item in listed if item["target"].startswith("192.0.2.")) / 1000
    banned = [probe(t) for t in LONG] + [UNBANNED]
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            seen = [await statuses(session, gw.url, banned) for gw in nodes]
            if all(set(s.values()) == {403} for s in seen):
                break
            await asyncio.sleep(0.1)
        assert all(set(s.values()) == {403} for s in seen), seen
        assert cli("unban", UNBANNED, "-c", conf).returncode == 0
        await asyncio.sleep(max(0.5, short_end_s + 0.3 - time.time()))  # the short bans have ended

        redis_server.kill()
        redis_server.start()
        assert redis_server.command("DBSIZE") == 0  # no persistence: it came back empty
        back = time.monotonic()

        wanted = {probe(t): 403 for t in LONG} | {c: 200 for c in SHORT} | {UNBANNED: 200}
        while True:
            seen = [await statuses(session, gw.url, list(wanted)) for gw in nodes]
            if all(s == wanted for s in seen):
                break
            assert time.monotonic() - back < 5, seen
            await asyncio.sleep(0.1)
        took = time.monotonic() - back

        # Redis holds them again, as they were: expiry and reason; nothing ended came back.
        stored = json.loads(cli("bans", "--json", "-c", conf).stdout)
        items = {item["target"]: item for item in stored}
        assert sorted(items) == sorted(t if "/" in t else t + ("/128" if ":" in t else "/32") for t in LONG)
        for target, item in items.items():
            if target in before:
                assert (item["until_ms"], item["reason"]) == (before[target]["until_ms"], before[target]["reason"])
        count = int(redis_server.command("HLEN", f"{prefix}gateway:bans"))
        assert count == len(LONG)  # both nodes put them back: once each, no duplicate

        restored = 0.0
        for port in metrics_ports:
            async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                text = await resp.text()
            values = [line.split()[-1] for line in text.splitlines() if line.startswith("gateway_bans_restored_total")]
            assert values, text[-2000:]
            restored += float(values[0])
        logs = "\n".join(gw.stderr() for gw in nodes)
        assert restored == len(LONG), logs  # what one node put back, the other found there
    for gw in nodes:
        assert "shared ban list in Redis was lost" in gw.stderr()
    print(f"every node enforced every ban again {took:.2f}s after Redis came back")
