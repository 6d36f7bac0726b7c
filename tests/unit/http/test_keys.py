"""Key extractors: IPv6 prefix masking and the hashing of keys longer than max_key.

The extractors read a real ``RequestContext`` built on an aiohttp request object
(aiohttp's own test helper makes it; the extractors never touch its transport).
"""

from __future__ import annotations

import ipaddress

import pytest
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from gateway.errors import ConfigErrors
from gateway.http.context import RequestContext
from gateway.http.keys import DEFAULT_MAX_KEY, HASHED_MARK, compile_key, hashed_key, longest_key, parse_key
from gateway.http.realip import parse_addr
from gateway.plan import load_config_text
from tests.support.config import config as support_config


def context(client: str = "192.0.2.1", headers: dict[str, str] | None = None, target: str = "/") -> RequestContext:
    request = make_mocked_request("GET", target, headers=CIMultiDict(headers or {}))
    peer = parse_addr(client)
    assert peer is not None
    return RequestContext(request, 0.0, peer, "http", 80)


def key_of(template: str, ctx: RequestContext, **options: int) -> bytes:
    return compile_key(parse_key(template), **options)(ctx)


# -- ipv6_prefix ----------------------------------------------------------------------------


def test_prefix_64_gives_every_address_of_a_64_the_same_binary_key():
    one = key_of("$binary_remote_addr", context("2001:db8:1:2::1"), ipv6_prefix=64)
    other = key_of("$binary_remote_addr", context("2001:db8:1:2:ffff:abcd:1234:5678"), ipv6_prefix=64)
    next_net = key_of("$binary_remote_addr", context("2001:db8:1:3::1"), ipv6_prefix=64)
    assert one == other == ipaddress.IPv6Address("2001:db8:1:2::").packed
    assert len(one) == 16
    assert next_net != one


def test_prefix_64_masks_remote_addr_text():
    assert key_of("$remote_addr", context("2001:db8:1:2:aaaa::9"), ipv6_prefix=64) == b"2001:db8:1:2::"
    assert key_of("zone:$remote_addr", context("2001:db8:1:2:aaaa::9"), ipv6_prefix=48) == b"zone:2001:db8:1::"


def test_prefix_128_keeps_nginx_binary_remote_addr_exactly():
    for address in ("2001:db8:1:2::1", "2001:db8:1:2::2", "fe80::1"):
        ctx = context(address)
        assert key_of("$binary_remote_addr", ctx) == ipaddress.ip_address(address).packed
        assert key_of("$binary_remote_addr", ctx, ipv6_prefix=128) == ctx.client.packed
        assert key_of("$remote_addr", ctx, ipv6_prefix=128) == address.encode()


@pytest.mark.parametrize("prefix", [1, 24, 64, 127])
def test_ipv4_clients_are_never_masked(prefix):
    for address in ("203.0.113.7", "203.0.113.8", "::ffff:198.51.100.1"):
        ctx = context(address)
        assert key_of("$binary_remote_addr", ctx, ipv6_prefix=prefix) == ctx.client.packed
        assert len(ctx.client.packed) == 4
        assert key_of("$remote_addr", ctx, ipv6_prefix=prefix) == ctx.client.text.encode()


@pytest.mark.parametrize("translated", ["64:ff9b::c633:6401", "64:ff9b:1::c633:6401", "64:ff9b:1:ab00:c6:3364:100:0"])
def test_nat64_addresses_stand_for_ipv4_clients_and_are_never_grouped(translated):
    """Behind a NAT64 translator the whole IPv4 Internet arrives from one /64: one abuser must
    not get every IPv4 client limited or banned with it."""
    ctx = context(translated)
    neighbour = context(str(ipaddress.IPv6Address(ctx.client.value + 1)))
    assert key_of("$binary_remote_addr", ctx, ipv6_prefix=64) == ctx.client.packed
    assert key_of("$binary_remote_addr", neighbour, ipv6_prefix=64) != ctx.client.packed
    assert key_of("$remote_addr", ctx, ipv6_prefix=64) == translated.encode()
    # just outside the NAT64 prefixes, masking applies
    outside = context("64:ff9b:0:1::c633:6401")
    assert key_of("$binary_remote_addr", outside, ipv6_prefix=64) == ipaddress.IPv6Address("64:ff9b:0:1::").packed


def test_odd_prefixes_mask_bit_by_bit():
    ctx_a = context("2001:db8::")
    ctx_b = context("2001:db8:0:1::")  # differs from ctx_a in bit 63
    assert key_of("$binary_remote_addr", ctx_a, ipv6_prefix=63) == key_of("$binary_remote_addr", ctx_b, ipv6_prefix=63)
    assert key_of("$binary_remote_addr", ctx_a, ipv6_prefix=64) != key_of("$binary_remote_addr", ctx_b, ipv6_prefix=64)
    assert key_of("$binary_remote_addr", context("ffff::1"), ipv6_prefix=1) == b"\x80" + b"\x00" * 15


@pytest.mark.parametrize("prefix", [0, 129, -1])
def test_compile_key_refuses_a_prefix_out_of_range(prefix):
    with pytest.raises(ValueError):
        compile_key(parse_key("$binary_remote_addr"), ipv6_prefix=prefix)


# -- max_key --------------------------------------------------------------------------------


def test_a_key_up_to_max_key_is_kept_and_a_longer_one_is_hashed():
    at_limit = "k" * DEFAULT_MAX_KEY
    over = "k" * (DEFAULT_MAX_KEY + 1)
    assert key_of("$http_x_key", context(headers={"X-Key": at_limit})) == at_limit.encode()
    hashed = key_of("$http_x_key", context(headers={"X-Key": over}))
    assert hashed == hashed_key(over.encode())
    assert hashed.startswith(HASHED_MARK) and len(hashed) == 17


def test_long_keys_that_share_a_long_prefix_stay_distinct():
    """An attacker's hope: keys are truncated, so two clients with one 300-byte prefix collide."""
    base = "p" * 300
    first = key_of("$http_x_key", context(headers={"X-Key": base + "a"}))
    second = key_of("$http_x_key", context(headers={"X-Key": base + "b"}))
    assert first != second
    assert len(first) == len(second) == 17


def test_the_same_long_key_always_maps_to_the_same_bucket():
    value = "x" * 5000
    assert key_of("$http_x_key", context(headers={"X-Key": value})) == key_of(
        "$http_x_key", context(headers={"X-Key": value})
    )


def test_a_composite_key_is_hashed_whole_and_max_key_is_settable():
    ctx = context("2001:db8::1", headers={"X-Key": "v" * 40})
    whole = ctx.client.packed + b"/" + b"v" * 40
    assert key_of("$binary_remote_addr/$http_x_key", ctx) == whole  # 57 bytes: under the default
    assert key_of("$binary_remote_addr/$http_x_key", ctx, max_key=32) == hashed_key(whole)


def test_templates_that_cannot_grow_past_max_key_are_not_wrapped():
    assert longest_key(parse_key("$binary_remote_addr")) == 16
    assert longest_key(parse_key("ip:$remote_addr:$server_port")) == 3 + 39 + 1 + 5
    assert longest_key(parse_key("$http_x_key")) is None
    assert longest_key(parse_key("$binary_remote_addr$uri")) is None
    for template in ("$binary_remote_addr", "$remote_addr", "$scheme$server_port"):
        assert "_bounded" not in compile_key(parse_key(template)).__qualname__
    assert "_bounded" in compile_key(parse_key("$uri")).__qualname__
    # below 39 bytes even $remote_addr can be too long: only its long texts are hashed
    longest_v6 = context("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff")
    assert key_of("$remote_addr", longest_v6, max_key=32) == hashed_key(longest_v6.client.text.encode())
    assert key_of("$remote_addr", context("2001:db8::1"), max_key=32) == b"2001:db8::1"


def test_an_empty_variable_still_means_no_key():
    assert key_of("$http_x_key", context()) == b""


@pytest.mark.parametrize("max_key", [0, 31, 4097])
def test_compile_key_refuses_a_max_key_out_of_range(max_key):
    with pytest.raises(ValueError):
        compile_key(parse_key("$http_x_key"), max_key=max_key)


# -- configuration ---------------------------------------------------------------------------


def config(zone: str) -> str:
    # block style, so that a test can append keys to the route
    return support_config("127.0.0.1:9", zones=f"  z: {zone}", routes="  - location: /\n    upstream: app")(8080)


def test_zone_defaults_are_nginx_compatible():
    spec = load_config_text(config("{type: req, key: $binary_remote_addr, rate: 1r/s}")).spec
    assert spec.zones["z"].max_key == 256
    assert spec.zones["z"].ipv6_prefix == 128


@pytest.mark.parametrize(
    ("zone", "route"),
    [
        ("{type: req, rate: 1r/s", "limit_req: [{zone: z}]"),
        ("{type: count, limit: 5, window: 1m", "limit_count: [{zone: z}]"),
        ("{type: conn", "limit_conn: [{zone: z, max: 1}]"),
    ],
)
def test_every_zone_type_compiles_max_key_and_ipv6_prefix_into_its_key(zone, route):
    text = config(zone + ", key: $binary_remote_addr$http_x_key, max_key: 64, ipv6_prefix: 64}")
    compiled = load_config_text(text + f"    {route}\n")
    assert (compiled.spec.zones["z"].max_key, compiled.spec.zones["z"].ipv6_prefix) == (64, 64)
    plan = compiled.routes[0]
    (limit,) = [*plan.limit_req, *plan.limit_count, *plan.limit_conn]
    masked = ipaddress.IPv6Address("2001:db8:1:2::").packed
    assert limit.key(context("2001:db8:1:2::7", headers={"X-Key": "a"})) == masked + b"a"
    assert limit.key(context("2001:db8:1:2::8", headers={"X-Key": "a" * 100})) == hashed_key(masked + b"a" * 100)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("max_key: 16", "invalid max_key 16: must be between 32 and 4096"),
        ("max_key: 1m", "expected an integer"),
        ("ipv6_prefix: 0", "invalid ipv6_prefix 0: must be between 1 and 128"),
        ("ipv6_prefix: 129", "invalid ipv6_prefix 129: must be between 1 and 128"),
        ('ipv6_prefix: "64"', "expected an integer"),
    ],
)
def test_bad_values_are_reported(setting, message):
    with pytest.raises(ConfigErrors) as info:
        load_config_text(config("{type: req, key: $binary_remote_addr, rate: 1r/s, " + setting + "}"))
    assert message in str(info.value)


def test_ipv6_prefix_on_a_key_without_an_address_is_an_error():
    with pytest.raises(ConfigErrors) as info:
        load_config_text(config("{type: req, key: $http_x_key, rate: 1r/s, ipv6_prefix: 64}"))
    assert "zones.z.ipv6_prefix" in str(info.value)
    assert "uses neither" in str(info.value)
    # 128, the default, is allowed anywhere
    load_config_text(config("{type: req, key: $http_x_key, rate: 1r/s, ipv6_prefix: 128}"))


# -- $host and $cookie_NAME as nginx reads them (tests/differential/test_host_and_cookie.py: the real binary) --


@pytest.mark.parametrize(
    ("host", "want"),
    [("Evil.Example.", b"evil.example"), ("evil.example.:8080", b"evil.example"), ("u@a.test.", b"a.test"),
     ("[::1].", b"[::1]"), ("[::1]:80", b"[::1]"), ("plain", b"plain")],
)  # fmt: skip
def test_host_drops_one_trailing_dot_and_the_port(host: str, want: bytes) -> None:
    assert key_of("$host", context(headers={"Host": host})) == want


@pytest.mark.parametrize(
    ("cookies", "want"),
    [(["admin = yes"], b"yes"), (["a=1,admin=yes"], b"yes"), (["admin=no; admin=yes"], b"no"),
     (["a=1", "Admin=yes"], b"yes"), (["admin=yes ; b"], b"yes "), (["admin=y, b=2"], b"y, b=2"),
     (["admin;admin=yes"], b""), (["adminx=1; admin=2"], b"2"), (['a="x;admin=yes"'], b'yes"'),
     (["admin"], b""), (["x"], b"")],
)  # fmt: skip
def test_cookie_is_parsed_as_nginx_parses_it(cookies: list[str], want: bytes) -> None:
    request = make_mocked_request("GET", "/", headers=CIMultiDict([("Cookie", c) for c in cookies]))
    ctx = RequestContext(request, 0.0, parse_addr("192.0.2.1"), "http", 80)  # type: ignore[arg-type]
    assert key_of("$cookie_admin", ctx) == want
