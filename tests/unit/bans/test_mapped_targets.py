"""An IPv4-mapped IPv6 ban (``::ffff:a.b.c.d``) is a ban on the IPv4 address it maps.

A client arriving on an IPv6 socket as ``::ffff:203.0.113.9`` is the IPv4 client
203.0.113.9 (``gateway.http.realip`` unmaps it), so a ban written in the mapped form must
match that client, and the width policy must see ``::ffff:0.0.0.0/96`` as all of IPv4.
"""

from __future__ import annotations

import pytest

from gateway.bans.policy import BanPolicy
from gateway.bans.table import Ban, BanList, canonical_target
from gateway.http.realip import parse_addr
from gateway.plan import load_config_text


@pytest.mark.parametrize(
    "text, canonical",
    [
        ("::ffff:203.0.113.9", "203.0.113.9/32"),
        ("::ffff:cb00:7109", "203.0.113.9/32"),
        ("::ffff:10.0.0.0/104", "10.0.0.0/8"),
        ("::ffff:0.0.0.0/96", "0.0.0.0/0"),
        ("2001:db8::1", "2001:db8::1/128"),
        ("::/0", "::/0"),
    ],
)
def test_mapped_targets_are_their_ipv4_networks(text, canonical):
    assert canonical_target(text) == canonical


def test_a_mapped_ban_matches_the_ipv4_client():
    bans = BanList()
    bans.put(Ban(canonical_target("::ffff:203.0.113.9"), 0, "mapped"))
    for seen_as in ("203.0.113.9", "::ffff:203.0.113.9", "[::ffff:203.0.113.9]:4242"):
        client = parse_addr(seen_as)
        assert client is not None
        match = bans.match(client, 1)
        assert match is not None and match.reason == "mapped", seen_as
    assert bans.match(parse_addr("203.0.113.10"), 1) is None


def test_all_of_ipv4_in_mapped_form_needs_force():
    spec = load_config_text(
        "upstreams: {app: {servers: ['127.0.0.1:9']}}\nroutes: [{location: /, upstream: app}]\n"
    ).spec
    refusal = BanPolicy(spec).refusal(canonical_target("::ffff:0.0.0.0/96"))
    assert refusal is not None and "wider than /16" in refusal
