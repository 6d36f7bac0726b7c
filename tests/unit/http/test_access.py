"""nginx's allow/deny lists compiled (gateway.http.access) and inherited through the plan."""

from __future__ import annotations

import ipaddress
import random

import pytest

from gateway.http.access import AccessRule, AccessRules
from gateway.http.realip import ClientAddr, parse_addr
from gateway.plan.load import load_config_text


def rules(*items: str) -> AccessRules:
    """``rules("allow 10.0.0.0/8", "deny all")``"""
    out = []
    for item in items:
        action, target = item.split()
        out.append(AccessRule(action == "allow", None if target == "all" else ipaddress.ip_network(target)))
    return AccessRules(out)


def addr(text: str) -> ClientAddr:
    parsed = parse_addr(text)
    assert parsed is not None
    return parsed


def first_match(items: list[tuple[bool, str]], client: str) -> bool:
    """The decision as nginx's handler reads it: the rules one by one, the first match decides."""
    ip = ipaddress.ip_address(client)
    for allow, target in items:
        if target == "all" or (
            ip.version == ipaddress.ip_network(target).version and ip in ipaddress.ip_network(target)
        ):
            return allow
    return True


def test_the_first_matching_rule_decides_in_the_order_written() -> None:
    allowlist = rules("deny 10.1.2.3", "allow 10.0.0.0/8", "deny all")
    assert not allowlist.allows(addr("10.1.2.3"))  # the deny before the wider allow wins
    assert allowlist.allows(addr("10.9.9.9"))
    assert not allowlist.allows(addr("192.0.2.1"))
    reverse = rules("allow 10.0.0.0/8", "deny 10.1.2.3", "deny all")
    assert reverse.allows(addr("10.1.2.3"))  # the same rules in the other order: the allow comes first


def test_no_match_lets_the_request_go_on_and_all_matches_every_family() -> None:
    blocklist = rules("deny 192.0.2.0/24", "deny 2001:db8::/32")
    assert blocklist.allows(addr("198.51.100.1")) and blocklist.allows(addr("2001:db9::1"))
    assert not blocklist.allows(addr("192.0.2.200")) and not blocklist.allows(addr("[2001:db8::5]:80"))
    closed = rules("deny all", "allow 10.0.0.1")  # nothing after all is reached
    assert not closed.allows(addr("10.0.0.1")) and not closed.allows(addr("::1"))
    opened = rules("allow all")
    assert opened.allows(addr("203.0.113.9")) and opened.allows(addr("2001:db8::1"))


def test_ipv6_rules_and_mapped_ipv4_clients() -> None:
    v6 = rules("allow 2001:db8:1::/48", "deny 2001:db8::/32", "allow 10.0.0.0/8", "deny all")
    assert v6.allows(addr("2001:db8:1:2::3")) and not v6.allows(addr("2001:db8:2::3"))
    assert not v6.allows(addr("2001:db9::1"))
    # an IPv4 client on an IPv6 socket (::ffff:a.b.c.d) meets the IPv4 rules, as in nginx
    assert v6.allows(addr("::ffff:10.1.2.3")) and not v6.allows(addr("::ffff:192.0.2.1"))
    # a rule written in the mapped form means the IPv4 network
    mapped = rules("allow ::ffff:192.0.2.0/120", "deny all")
    assert mapped.allows(addr("192.0.2.77")) and mapped.allows(addr("::ffff:192.0.2.77"))
    assert not mapped.allows(addr("192.0.3.1"))


def test_a_repeated_network_is_decided_by_its_first_rule() -> None:
    assert not rules("deny 10.0.0.0/8", "allow 10.0.0.0/8").allows(addr("10.2.3.4"))
    assert rules("allow 10.0.0.0/8", "deny 10.0.0.0/8", "deny all").allows(addr("10.2.3.4"))


def test_the_compiled_lookup_agrees_with_reading_the_rules_one_by_one() -> None:
    rng = random.Random(24)
    nets = ["10.0.0.0/8", "10.1.0.0/16", "10.1.2.0/24", "10.1.2.3/32", "192.0.2.0/24", "0.0.0.0/0",
            "2001:db8::/32", "2001:db8:1::/48", "::/0", "::1/128"]  # fmt: skip
    clients = ["10.1.2.3", "10.1.2.4", "10.1.3.1", "10.2.0.1", "192.0.2.9", "8.8.8.8", "2001:db8:1::1",
               "2001:db8:2::1", "::1", "2001:db9::1"]  # fmt: skip
    for _ in range(300):
        items = [(rng.random() < 0.5, rng.choice(nets + ["all"])) for _ in range(rng.randint(0, 6))]
        compiled = AccessRules(
            AccessRule(allow, None if target == "all" else ipaddress.ip_network(target)) for allow, target in items
        )
        for client in clients:
            assert compiled.allows(addr(client)) == first_match(items, client), (items, client)


YAML = """
listen: 127.0.0.1:9
upstreams: {app: {servers: ["127.0.0.1:1"]}}
access: [{deny: 192.0.2.1}]
servers:
  - server_name: a.test
    access: [{allow: 10.0.0.0/8}, {deny: all}]
    routes:
      - {location: /, upstream: app}
      - {location: /open/, upstream: app, access: [{allow: all}]}
      - {location: /none/, upstream: app, access: []}
  - server_name: b.test
    routes:
      - {location: /, upstream: app}
      - {location: /lan/, upstream: app, access: [{allow: 10.0.0.0/8}, {deny: all}]}
"""


def test_a_level_with_a_list_of_its_own_does_not_inherit_the_outer_one() -> None:
    config = load_config_text(YAML)
    a, b = config.servers
    a_root, a_open, a_none = a.routes
    b_root, b_lan = b.routes
    assert a_root.access is not None and not a_root.access.allows(addr("192.0.2.2"))
    assert a_root.access.allows(addr("10.0.0.7"))
    assert a_open.access is not None and a_open.access.allows(addr("192.0.2.1"))  # the top's deny is not in force
    assert a_none.access is None  # an empty list of its own: nothing inherited, nothing checked
    assert b_root.access is not None and not b_root.access.allows(addr("192.0.2.1"))  # the top level's, whole
    assert b_root.access.allows(addr("192.0.2.2"))
    assert b_lan.access is not None and b_lan.access.allows(addr("10.0.0.7"))
    # one list, compiled once: the routes that have it in force share it
    assert b_lan.access is a_root.access


def test_the_mapping_form_keeps_its_lists_beside_the_rules() -> None:
    config = load_config_text(
        "listen: 127.0.0.1:9\nupstreams: {app: {servers: ['127.0.0.1:1']}}\n"
        "access: {deny: [203.0.113.0/24], allow: [10.0.0.1], rules: [{deny: 10.0.0.0/8}]}\n"
        "routes: [{location: /, upstream: app}]\n"
    )
    assert addr("203.0.113.5") in config.deny and addr("10.0.0.1") in config.allow
    route = config.routes[0]
    assert route.access is not None and not route.access.allows(addr("10.0.0.1"))


@pytest.mark.parametrize("value", ["[]", "{allow: [10.0.0.1]}"])
def test_no_rules_means_no_check(value: str) -> None:
    config = load_config_text(
        f"listen: 127.0.0.1:9\nupstreams: {{app: {{servers: ['127.0.0.1:1']}}}}\naccess: {value}\n"
        "routes: [{location: /, upstream: app}]\n"
    )
    assert config.routes[0].access is None
