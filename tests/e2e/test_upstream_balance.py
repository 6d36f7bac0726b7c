"""``balance:`` on an upstream, through the gateway's CLI: ``hash $key`` and ``hash $key
consistent`` send a key to the server nginx would (``gateway.proxy.hashing``, checked against
nginx in tests/differential/test_hash_balancing.py), and the default stays round-robin."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest

from gateway.proxy.hashing import ConsistentRing, hash_pick
from tests.support.config import config
from tests.support.upstreams import Upstream


@pytest.fixture
def three() -> Iterator[list[Upstream]]:
    ups = [Upstream(f"u{i}").start() for i in range(3)]
    yield ups
    for up in ups:
        up.stop()


def served_by(port: int, key: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/?k={key}", timeout=5) as resp:
        return str(json.loads(resp.read())["server"])


@pytest.mark.parametrize("consistent", [False, True])
def test_hash_key_picks_nginx_s_server(gateway_factory, three: list[Upstream], consistent: bool) -> None:
    balance = "hash $arg_k" + (" consistent" if consistent else "")
    gw = gateway_factory(config(three, admin='{listen: "off"}', upstream_options=f'balance: "{balance}"'))
    ring = ConsistentRing([(up.address, 1) for up in three])
    for i in range(40):
        key = f"user{i}"
        index = (
            ring.pick(key.encode(), lambda _: True)
            if consistent
            else hash_pick(key.encode(), [1, 1, 1], lambda _: True)
        )
        assert index is not None
        assert served_by(gw.port, key) == f"u{index}", key


def test_round_robin_stays_the_default(gateway_factory, three: list[Upstream]) -> None:
    gw = gateway_factory(config(three, admin='{listen: "off"}'))
    assert {served_by(gw.port, "same") for _ in range(6)} == {"u0", "u1", "u2"}
