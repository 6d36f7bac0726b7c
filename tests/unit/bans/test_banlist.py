"""The local ban table, the blocklist format and the ban policy index, on real data."""

from __future__ import annotations

import ipaddress
import random
import time

import pytest

from gateway.bans.blocklist import parse_blocklist
from gateway.bans.policy import BanPolicy
from gateway.bans.table import Ban, BanList, CidrSet, canonical_target, net_key
from gateway.http.realip import parse_addr
from gateway.plan import load_config_text
from tests.support.ban_lists import mixed_blocklist, samples


def addr(text: str):  # type: ignore[no-untyped-def]
    parsed = parse_addr(text)
    assert parsed is not None
    return parsed


def test_the_most_specific_ban_wins_and_removal_falls_back_to_the_wider_one():
    bans = BanList()
    bans.put(Ban("10.1.0.0/16", 0, "wide"))
    bans.put(Ban("10.1.2.0/24", 0, "narrow"))
    bans.put(Ban("2001:db8::/64", 0, "v6"))
    assert bans.match(addr("10.1.2.3"), 0).reason == "narrow"  # type: ignore[union-attr]
    assert bans.match(addr("10.1.9.9"), 0).reason == "wide"  # type: ignore[union-attr]
    assert bans.match(addr("2001:db8::77"), 0).reason == "v6"  # type: ignore[union-attr]
    assert bans.match(addr("10.2.0.1"), 0) is None
    assert bans.remove("10.1.2.0/24") and not bans.remove("10.1.2.0/24")
    assert bans.match(addr("10.1.2.3"), 0).reason == "wide"  # type: ignore[union-attr]
    assert bans.prefix_lengths() == {4: (16,), 6: (64,)}  # an emptied prefix length is no longer walked


def test_an_ended_ban_stops_matching_and_the_expiry_heap_removes_only_ended_ones():
    bans = BanList()
    bans.put(Ban("192.0.2.1/32", 1_000, "short"))
    bans.put(Ban("192.0.2.0/24", 0, "forever"))
    bans.put(Ban("192.0.2.2/32", 1_000, "rebanned"))
    bans.put(Ban("192.0.2.2/32", 9_000, "rebanned"))  # the old end stays in the heap, stale
    assert bans.match(addr("192.0.2.1"), 500).reason == "short"  # type: ignore[union-attr]
    assert bans.match(addr("192.0.2.1"), 1_000).reason == "forever"  # type: ignore[union-attr]
    assert bans.purge_expired(5_000) == 1
    assert sorted(bans.bans) == ["192.0.2.0/24", "192.0.2.2/32"]
    assert bans.purge_expired(10_000) == 1 and sorted(bans.bans) == ["192.0.2.0/24"]


def test_a_change_costs_the_same_with_100k_bans_as_with_1k():
    targets = mixed_blocklist(101_000, seed=5)
    bans = BanList()

    def time_puts(batch: list[str]) -> float:
        started = time.perf_counter()
        for target in batch:
            bans.put(Ban(target, 0))
        return (time.perf_counter() - started) / len(batch)

    small = time_puts(targets[:1000])
    for target in targets[1000:100_000]:
        bans.put(Ban(target, 0))
    large = time_puts(targets[100_000:])
    assert len(bans) == 101_000
    assert large < 5 * small + 20e-6, (small, large)  # no recompile: not 100 times the cost
    started = time.perf_counter()
    for target in targets[:1000]:
        bans.remove(target)
    assert (time.perf_counter() - started) / 1000 < 5 * small + 20e-6


def test_the_fast_canonical_form_is_the_one_ipaddress_gives():
    rng = random.Random(1)
    cases = [
        "1.2.3.4",
        " 10.0.0.0/8 ",
        "10.1.2.3/8",
        "0.0.0.0/0",
        "::",
        "::1",
        "::/0",
        "2001:DB8::1/64",
        "2001:0db8:0000:0000:0000:0000:0000:0001",
        "::ffff:1.2.3.4",
        "::1.2.3.4",
        "64:ff9b::192.0.2.33/128",
        "fe80::1:0:0:1/128",
        "2001:db8:0:1:0:0:0:1",
    ]
    for _ in range(2000):
        if rng.random() < 0.5:
            cases.append(f"{ipaddress.IPv4Address(rng.getrandbits(32))}/{rng.randint(0, 32)}")
        else:
            groups = [rng.choice([0, 0, 0, rng.getrandbits(16)]) for _ in range(8)]
            cases.append(":".join(f"{g:x}" for g in groups) + f"/{rng.randint(0, 128)}")
    mapped = ipaddress.IPv6Network("::ffff:0:0/96")

    def oracle(text: str) -> str:  # ipaddress's form; a mapped IPv6 network is the IPv4 one it maps
        net = ipaddress.ip_network(text.strip(), strict=False)
        if net.version == 6 and net.prefixlen >= 96 and net.subnet_of(mapped):
            return f"{ipaddress.IPv4Address(int(net.network_address) & 0xFFFFFFFF)}/{net.prefixlen - 96}"
        return str(net)

    for text in cases:
        assert canonical_target(text) == oracle(text), text


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "1.2.3",
        "1.2.3.4/33",
        "1.2.3.4/-1",
        "1.2.3.4/+8",
        "1.2.3.4/ 8",
        "01.2.3.4",
        "1.2.3.4/٣",
        "::/129",
        "a" * 5000,
    ],
)
def test_anything_else_is_refused_with_a_short_message(bad):
    with pytest.raises(ValueError) as caught:
        canonical_target(bad)
    assert len(str(caught.value)) < 120


def test_the_blocklist_format_of_public_feeds():
    text = [
        "# Spamhaus DROP-like feed",
        "",
        "1.2.3.0/24 ; SBL123",
        "5.6.7.8   # a comment",
        "2001:db8::/48",
        "not-an-address",
        "1.2.3.0/24",  # a repeat: kept once
        "10.0.0.1/40",
        "\tfe80::1\t",
    ]
    found = parse_blocklist(text)
    assert found.targets == [(3, "1.2.3.0/24"), (4, "5.6.7.8/32"), (5, "2001:db8::/48"), (9, "fe80::1/128")]
    assert found.errors == [
        (6, "not an IP address or CIDR: not-an-address"),
        (8, "not an IP address or CIDR: 10.0.0.1/40"),
    ]


def test_the_policy_index_agrees_with_a_pass_over_every_trusted_network():
    rng = random.Random(2)
    allow = sorted({f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.0/{rng.choice([24, 28, 32])}" for _ in range(300)})
    spec = load_config_text(
        "access: {allow: [" + ", ".join(allow) + ", '2001:db8:5::/56']}\n"
        "real_ip: {from: [10.200.0.0/16]}\n"
        "upstreams: {app: {servers: ['127.0.0.1:9']}}\nroutes: [{location: /, upstream: app}]\n"
    ).spec
    policy = BanPolicy(spec)
    trusted = [(n, "real_ip.from") for n in spec.real_ip.trusted] + [(n, "access.allow") for n in spec.access.allow]
    candidates = [f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}" for _ in range(2000)]
    candidates += [f"10.{rng.randint(0, 255)}.0.0/{rng.choice([16, 20, 23])}" for _ in range(300)]
    candidates += ["2001:db8:5:7::/64", "2001:db8::/48", "2001:db8:6::1"]
    for text in candidates:
        target = canonical_target(text)
        net = ipaddress.ip_network(target)
        naive = next((f"{target} covers {p} in {label}" for p, label in trusted if net.overlaps(p)), None)
        if net.prefixlen < (16 if net.version == 4 else 48):
            naive = f"{target} is wider than /{16 if net.version == 4 else 48}"
        got = policy.refusal(target)
        assert (got is None) == (naive is None), (target, got, naive)
        if got is not None and naive is not None and "covers" in naive:
            assert got.startswith(f"{target} covers ")


def test_a_static_set_of_100k_networks_matches_like_the_ban_table():
    targets = mixed_blocklist(100_000, seed=9)
    started = time.perf_counter()
    static = CidrSet(net_key(t) for t in targets)
    assert time.perf_counter() - started < 5
    assert len(static) == 100_000
    assert all(addr(a) in static for a in samples(targets))
    assert addr("192.0.2.1") not in static and addr("2001:db9::1") not in static
