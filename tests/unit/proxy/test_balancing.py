"""``gateway.proxy.hashing``: the properties nginx's hash balancing is chosen for (the exact picks
are compared with the nginx binary in tests/differential/test_hash_balancing.py)."""

from __future__ import annotations

import ipaddress
import socket
from collections import Counter
from typing import Any

from gateway.proxy.hashing import ConsistentRing, _host_port, hash_pick, ip_hash_key, ip_hash_pick


def always(_: int) -> bool:
    return True


def test_ip_hash_uses_three_octets_of_ipv4_and_all_of_ipv6() -> None:
    weights = [1, 1, 1, 1]
    a = ip_hash_pick(socket.inet_aton("198.51.100.1"), weights, always)
    assert all(ip_hash_pick(socket.inet_aton(f"198.51.100.{i}"), weights, always) == a for i in range(256))
    assert ip_hash_key(ipaddress.ip_address("2001:db8::1").packed) == ipaddress.ip_address("2001:db8::1").packed
    picks = {ip_hash_pick(ipaddress.ip_address(f"2001:db8::{i:x}").packed, weights, always) for i in range(64)}
    assert len(picks) > 1


def test_a_down_server_keeps_its_slot() -> None:
    """Only the clients of the server that went down move; everyone else stays."""
    weights = [1, 1, 1, 1]
    addrs = [socket.inet_aton(f"10.{i // 256}.{i % 256}.1") for i in range(2000)]
    before = [ip_hash_pick(a, weights, always) for a in addrs]
    after = [ip_hash_pick(a, weights, lambda i: i != 2) for a in addrs]
    for b, a in zip(before, after, strict=True):
        assert a != 2
        if b != 2:
            assert a == b


def test_hash_spreads_by_weight_and_keeps_keys_of_live_servers() -> None:
    weights = [1, 3]
    counts = Counter(hash_pick(f"k{i}".encode(), weights, always) for i in range(8000))
    assert 0.18 < counts[0] / 8000 < 0.32
    moved = [hash_pick(f"k{i}".encode(), [1, 1, 1], lambda i: i != 0) for i in range(500)]
    kept = [hash_pick(f"k{i}".encode(), [1, 1, 1], always) for i in range(500)]
    assert all(m == k for m, k in zip(moved, kept, strict=True) if k != 0)


def test_round_robin_decides_without_a_key_or_with_one_server() -> None:
    assert hash_pick(b"", [1, 1], always) is None
    assert hash_pick(b"k", [1], always) is None
    assert ip_hash_pick(b"\x01\x02\x03\x04", [5], always) is None
    assert ConsistentRing([("a:1", 1)]).pick(b"", always) is None
    assert hash_pick(b"k", [1, 1], lambda i: False) is None  # 20 tries, then round-robin


def test_consistent_ring_moves_only_the_keys_of_a_removed_server() -> None:
    names = [(f"10.0.0.{i}:80", 1) for i in range(1, 6)]
    full = ConsistentRing(names)
    less = ConsistentRing(names[:4])
    keys = [f"user{i}".encode() for i in range(3000)]
    for key in keys:
        before = full.pick(key, always)
        if before != 4:
            assert less.pick(key, always) == before
    assert len(full.hashes) == 5 * 160
    spread = Counter(full.pick(k, always) for k in keys)
    assert min(spread.values()) > 3000 / 5 * 0.6


def test_ring_names_split_like_nginx() -> None:
    assert _host_port("127.0.0.1:8080") == (b"127.0.0.1", b"8080")
    assert _host_port("[::1]:80") == (b"[::1]", b"80")
    assert _host_port("unix:/run/app.sock") == (b"/run/app.sock", b"")
    assert _host_port("backend.example") == (b"backend.example", b"")


# -- the balancer, with balance: ip_hash ----------------------------------------------------------------


def test_balancer_ip_hash_follows_the_client_and_skips_failed_and_tried() -> None:
    from types import SimpleNamespace

    from gateway.config.upstreams import BalanceSpec, ServerSpec
    from gateway.http.realip import parse_addr
    from gateway.proxy.balancer import Balancer

    servers = [ServerSpec(host="10.0.0.1", port=80 + i) for i in range(4)]
    balancer = Balancer(servers, lambda: 1_000_000, BalanceSpec("ip_hash"))
    ctx: Any = SimpleNamespace(client=parse_addr("198.51.100.20"))
    first = balancer.pick(set(), ctx)
    assert first is not None
    assert first.index == ip_hash_pick(socket.inet_aton("198.51.100.20"), [1, 1, 1, 1], always)
    assert all(balancer.pick(set(), ctx) is first for _ in range(10))
    retry = balancer.pick({first.index}, ctx)
    assert retry is not None and retry is not first
    balancer.report(first, failed=True)  # max_fails 1: down for fail_timeout
    moved = balancer.pick(set(), ctx)
    assert moved is not None and moved is not first


# -- balance: in the config, and from nginx's upstream block ----------------------------------------------


def test_balance_is_parsed_and_checked() -> None:
    import pytest

    from gateway.errors import ConfigErrors
    from gateway.plan.load import load_config_text

    head = "admin: {listen: 'off'}\nroutes:\n  - {location: /, upstream: app}\nupstreams:\n  app: "
    config = load_config_text(head + "{servers: [127.0.0.1:1, 127.0.0.1:2], balance: 'hash $uri consistent'}\n")
    assert str(config.spec.upstreams["app"].balance) == "hash $uri consistent"
    for bad in ("'least_slow'", "'hash'", "'hash $nope'", "'hash $uri sometimes'"):
        with pytest.raises(ConfigErrors, match="balance"):
            load_config_text(head + f"{{servers: [127.0.0.1:1], balance: {bad}}}\n")
    backup = "{servers: [127.0.0.1:1, {address: 127.0.0.1:2, backup: true}], balance: ip_hash}\n"
    with pytest.raises(ConfigErrors, match="backup"):
        load_config_text(head + backup)


def test_import_nginx_translates_ip_hash_and_hash(tmp_path: Any) -> None:
    import subprocess
    import sys

    import yaml

    from tests.support.paths import ROOT

    conf = tmp_path / "nginx.conf"
    conf.write_text(
        "http { upstream a { ip_hash; server 127.0.0.1:1; server 127.0.0.1:2 down; }\n"
        "  upstream b { hash $request_uri consistent; server 127.0.0.1:3; server 127.0.0.1:4; }\n"
        "  server { listen 8080; location / { proxy_pass http://a; } location /b { proxy_pass http://b; } } }\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "import-nginx", str(conf)], cwd=str(ROOT), capture_output=True, text=True
    )
    doc = yaml.safe_load(result.stdout)
    assert doc["upstreams"]["a"]["balance"] == "ip_hash"
    assert doc["upstreams"]["b"]["balance"] == "hash $request_uri consistent"
