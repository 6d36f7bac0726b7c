"""``maps:`` and ``geo:``: the lookup order of a map, geo's longest prefix and ranges, and where
their variables may be used; configuration errors name the file, line and key.

Lookups are checked through the real config loader and a real ``RequestContext`` (aiohttp's
``make_mocked_request``), as the request path sees them; the tables are also probed directly.
"""

from __future__ import annotations

import ipaddress
import re

import pytest
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from gateway.errors import ConfigErrors
from gateway.http.context import RequestContext
from gateway.http.keys import compile_key, parse_key
from gateway.http.maps import GeoTable, MapTable, address_of, paint_ranges
from gateway.http.realip import parse_addr
from gateway.plan import CompiledConfig, load_config_text

HEAD = "listen: 127.0.0.1:8080\nadmin: {listen: 'off'}\nupstreams: {app: {servers: [127.0.0.1:9000]}}\n"


def context(
    client: str = "192.0.2.1", headers: dict[str, str] | None = None, target: str = "/", method: str = "GET"
) -> RequestContext:
    request = make_mocked_request(method, target, headers=CIMultiDict(headers or {}))
    peer = parse_addr(client)
    assert peer is not None
    ctx = RequestContext(request, 0.0, peer, "http", 80)
    ctx.uri = target.split("?", 1)[0]
    return ctx


def load(variables: str, zones: str = "", route: str = "") -> CompiledConfig:
    zones = zones or "  z: {type: req, key: $probe, rate: 1r/s}"
    text = HEAD + variables + "\nzones:\n" + zones + "\nroutes:\n  - location: /\n    upstream: app\n"
    text += route or "    limit_req: [{zone: z}]\n"
    return load_config_text(text, "conf.yaml")


def probe(variables: str, ctx: RequestContext, zone: str = "z") -> bytes:
    compiled = load(variables)
    return compiled.routes[0].limit_req[0].key(ctx) if zone == "z" else b""


def errors(text: str) -> list[str]:
    with pytest.raises(ConfigErrors) as caught:
        load_config_text(HEAD + text, "conf.yaml")
    return [str(e) for e in caught.value.errors]


# -- map: lookup order -----------------------------------------------------------------------------

ORDER = """
maps:
  probe:
    source: $arg_a
    default: fallback
    values:
      exact: E
      "~^ex": R1
      "~*^EXA": R2
      "~(?<num>[0-9]+)x": "n=$num"
      "~^(a)(b)?-": "first=$1 second=$2 ninth=$9"
      "": empty
"""


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        ("exact", b"E"),  # an exact key wins over the regexes that match it too
        ("EXACT", b"E"),  # exact keys ignore ASCII case, as nginx's hash does
        ("exam", b"R1"),  # then the regexes, in order
        ("EXAM", b"R2"),  # ~ is case-sensitive, ~* is not
        ("ab12xz", b"n=12"),  # named captures in the value
        ("a-z", b"first=a second= ninth="),  # numbered ones; unmatched and absent groups are empty
        ("", b"empty"),  # an empty source matches an exact "" key, never a regex
        ("zzz", b"fallback"),
    ],
)
def test_map_lookup_order_exact_then_regexes_in_order_then_default(arg, expected):
    assert probe(ORDER, context(target=f"/?a={arg}")) == expected


def test_map_without_default_gives_empty_and_an_empty_key_is_not_limited():
    compiled = load('maps:\n  probe: {source: $arg_a, values: {"1": $binary_remote_addr}}')
    limit = compiled.routes[0].limit_req[0]
    assert limit.key(context("10.1.2.3", target="/?a=1")) == ipaddress.ip_address("10.1.2.3").packed
    assert limit.key(context(target="/?a=2")) == b""


def test_map_source_of_several_variables_and_values_with_variables():
    text = """
maps:
  probe:
    source: "$request_method:$uri"
    default: "other:$http_user_agent"
    values:
      "POST:/login": "login:$remote_addr"
"""
    assert probe(text, context("10.0.0.7", target="/login", method="POST")) == b"login:10.0.0.7"
    assert probe(text, context(target="/login", headers={"User-Agent": "curl/8"})) == b"other:curl/8"


HOSTNAMES = """
maps:
  probe:
    source: $http_x_name
    hostnames: true
    default: none
    values:
      www.example.com: exact
      .example.com: dot
      "*.b.example.com": star
      www.example.*: tail
      "~^api[0-9]\\\\.": regex
"""


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("www.example.com", b"exact"),
        ("WWW.Example.COM.", b"exact"),  # case and one trailing dot do not matter with hostnames
        ("example.com", b"dot"),  # .example.com is example.com itself too
        ("a.example.com", b"dot"),
        ("x.b.example.com", b"star"),  # the longest wildcard suffix wins
        ("b.example.com", b"dot"),  # *.b.example.com needs a label before it
        ("www.example.org", b"tail"),
        ("www.example.co.uk", b"tail"),
        ("api1.example.com", b"dot"),  # wildcards come before regexes
        ("api1.test", b"regex"),
        ("other.org", b"none"),
    ],
)
def test_hostnames_map_exact_then_head_wildcards_then_tail_then_regex(name, expected):
    assert probe(HOSTNAMES, context(headers={"X-Name": name})) == expected


def test_map_of_a_map_of_a_geo_is_the_allowlist_idiom():
    text = """
geo:
  limited:
    default: "1"
    values: {10.0.0.0/8: "0", 10.9.0.0/16: "1"}
maps:
  probe:
    source: $limited
    values: {"0": "", "1": $binary_remote_addr}
"""
    assert probe(text, context("10.1.2.3")) == b""
    assert probe(text, context("10.9.2.3")) == ipaddress.ip_address("10.9.2.3").packed  # longest prefix
    assert probe(text, context("192.0.2.9")) == ipaddress.ip_address("192.0.2.9").packed
    assert probe(text, context("2001:db8::1")) == ipaddress.ip_address("2001:db8::1").packed


def test_map_table_probes_directly():
    table = MapTable(exact={b"post": b"p"}, default=b"d", regexes=[(re.compile(b"^G"), b"g")])
    assert table.find(b"POST") == (b"p", None)
    value, match = table.find(b"GET")
    assert value == b"g" and match is not None
    assert table.find(b"get") == (b"d", None)


# -- geo ----------------------------------------------------------------------------------------


def test_geo_longest_prefix_ipv4_and_ipv6():
    table = GeoTable(
        b"default",
        networks=[
            (4, 8, int(ipaddress.IPv4Address("10.0.0.0")), b"ten"),
            (4, 16, int(ipaddress.IPv4Address("10.1.0.0")), b"ten-one"),
            (4, 32, int(ipaddress.IPv4Address("10.1.2.3")), b"host"),
            (6, 32, int(ipaddress.IPv6Address("2001:db8::")), b"doc"),
            (6, 128, int(ipaddress.IPv6Address("::1")), b"loop6"),
        ],
    )
    assert table.find(*address_of(b"10.200.0.1")) == b"ten"
    assert table.find(*address_of(b"10.1.200.1")) == b"ten-one"
    assert table.find(*address_of(b"10.1.2.3")) == b"host"
    assert table.find(*address_of(b"11.0.0.1")) == b"default"
    assert table.find(*address_of(b"2001:db8:ffff::1")) == b"doc"
    assert table.find(*address_of(b"::1")) == b"loop6"
    assert table.find(*address_of(b"::ffff:10.1.2.3")) == b"host"  # IPv4-mapped is IPv4
    assert table.find(*address_of(b"2001:db9::1")) == b"default"
    assert table.find(*address_of(b"not an address")) == b"default"


def test_geo_from_config_uses_the_client_address_or_another_source():
    text = """
geo:
  probe:
    default: far
    values: {192.0.2.0/24: doc, "::1": six, 0.0.0.0/1: low}
  by_header:
    source: $http_x_test_ip
    default: none
    values: {198.51.100.0/24: net2}
"""
    compiled = load(
        text,
        zones="  z: {type: req, key: $probe, rate: 1r/s}\n  h: {type: req, key: $by_header, rate: 1r/s}",
        route="    limit_req: [{zone: z}, {zone: h}]\n",
    )
    z, h = compiled.routes[0].limit_req
    ctx = context("192.0.2.77")
    assert z.key(ctx) == b"doc"
    assert z.key(context("::1")) == b"six"
    assert z.key(context("200.0.0.1")) == b"far"
    assert z.key(context("1.0.0.1")) == b"low"
    ctx = context(headers={"X-Test-IP": "198.51.100.4"})
    assert h.key(ctx) == b"net2"
    assert h.key(context(headers={"X-Test-IP": "junk"})) == b"none"


def test_geo_ranges_nested_ranges_split_and_ipv6_is_not_in_them():
    text = """
geo:
  probe:
    ranges: true
    default: out
    values:
      10.0.0.0-10.255.255.255: ten
      10.1.0.0-10.1.255.255: ten-one
      192.0.2.10-192.0.2.20: doc
"""
    assert probe(text, context("10.0.0.1")) == b"ten"
    assert probe(text, context("10.1.9.9")) == b"ten-one"
    assert probe(text, context("10.2.0.0")) == b"ten"
    assert probe(text, context("192.0.2.20")) == b"doc"
    assert probe(text, context("192.0.2.21")) == b"out"
    assert probe(text, context("2001:db8::1")) == b"out"


def test_paint_ranges_refuses_a_partial_overlap():
    assert paint_ranges([(1, 10, "a", "x"), (3, 4, "b", "y")]) == [(1, 2, "a"), (3, 4, "b"), (5, 10, "a")]
    with pytest.raises(ValueError, match="overlaps"):
        paint_ranges([(1, 10, "a", "x"), (5, 20, "b", "y")])
    with pytest.raises(ValueError, match="overlaps"):
        paint_ranges([(5, 20, "a", "x"), (1, 10, "b", "y")])


# -- where variables may be used -------------------------------------------------------------


def test_map_in_headers_and_return_text():
    text = """
maps:
  tier:
    source: $http_user_agent
    default: human
    values: {"~*bot": robot}
"""
    compiled = load(
        text,
        zones="  z: {type: req, key: $tier, rate: 1r/s}",
        route=(
            "    limit_req: [{zone: z}]\n"
            "    proxy_set_header: {X-Tier: $tier}\n"
            "    add_header: [{name: X-Seen, value: 'tier=$tier'}]\n"
        ),
    )
    route = compiled.routes[0]
    ctx = context(headers={"User-Agent": "Googlebot/2.1"})
    assert route.limit_req[0].key(ctx) == b"robot"
    assert route.rewrite is not None and route.rewrite.set_fields is not None
    _, fields = route.rewrite.set_fields(ctx)
    assert fields == [("X-Tier", "robot")]
    assert route.add_header[0].value(ctx) == "tier=robot"
    assert ctx.variables is not None  # used three times: computed once and kept for the request
    returned = load_config_text(
        HEAD + text + "\nroutes:\n  - location: /\n    return: {code: 200, text: 'you are $tier'}\n", "c.yaml"
    )
    assert returned.routes[0].ret is not None and returned.routes[0].ret.text is not None
    assert returned.routes[0].ret.text(context(headers={"User-Agent": "x"})) == "you are human"


def test_a_map_used_once_is_not_kept_in_the_request():
    compiled = load('maps:\n  probe: {source: $arg_a, values: {"1": one}}')
    ctx = context(target="/?a=1")
    assert compiled.routes[0].limit_req[0].key(ctx) == b"one"
    assert ctx.variables is None


def test_a_map_used_twice_is_computed_once_per_request():
    compiled = load(
        'maps:\n  probe: {source: $arg_a, values: {"~^(.*)$": "v$1"}}',
        zones="  z: {type: req, key: $probe, rate: 1r/s}\n  c: {type: conn, key: $probe}",
        route="    limit_req: [{zone: z}]\n    limit_conn: [{zone: c, max: 1}]\n",
    )
    route = compiled.routes[0]
    ctx = context(target="/?a=7")
    assert route.limit_req[0].key(ctx) == b"v7" == route.limit_conn[0].key(ctx)
    assert ctx.variables is not None and list(ctx.variables.values()) == [b"v7"]


def test_replay_contexts_can_hold_map_values():
    from gateway.replay.simulate import context_of

    compiled = load(
        'maps:\n  probe: {source: $request_method, default: "", values: {POST: $remote_addr}}',
        zones="  z: {type: req, key: $probe, rate: 1r/s}\n  c: {type: conn, key: $probe}",
        route="    limit_req: [{zone: z}]\n    limit_conn: [{zone: c, max: 1}]\n",
    )
    ctx = context_of({"remote_addr": "10.1.2.3", "request": "POST /x HTTP/1.1"})
    assert compiled.routes[0].limit_req[0].key(ctx) == b"10.1.2.3" == compiled.routes[0].limit_conn[0].key(ctx)


def test_zone_ipv6_prefix_masks_the_address_a_map_gives():
    compiled = load(
        "maps:\n  probe: {source: $arg_a, default: $binary_remote_addr}",
        zones="  z: {type: req, key: $probe, rate: 1r/s, ipv6_prefix: 64}",
    )
    key = compiled.routes[0].limit_req[0].key(context("2001:db8:1:2::99"))
    assert key == ipaddress.IPv6Address("2001:db8:1:2::").packed


def test_keys_without_variables_compile_as_before():
    assert compile_key(parse_key("$binary_remote_addr"))(context("192.0.2.1")) == bytes([192, 0, 2, 1])


# -- configuration errors -----------------------------------------------------------------------


def test_errors_name_file_line_and_key():
    found = errors(
        """maps:
  limit_key:
    source: $nope
    values: {"~(": x}
  host: {source: $uri}
geo:
  limit_key: {default: "1"}
  g2:
    values: {10.0.0.300/8: "0"}
  g3:
    ranges: true
    values: {"10.0.0.0-10.0.0.9": a, "10.0.0.5-10.0.0.20": b}
routes:
  - location: /
    upstream: app
    proxy_set_header: {X-Key: $undefined_map}
"""
    )
    text = "\n".join(found)
    assert re.search(r'conf\.yaml:6:\d+: maps\.limit_key\.source: unknown "nope" variable', text), text
    assert re.search(r"conf\.yaml:7:\d+: maps\.limit_key\.values\.~\(: invalid regular expression", text), text
    assert re.search(r'conf\.yaml:8:\d+: maps\.host: "\$host" is a variable of nginx\'s own', text), text
    assert re.search(r'conf\.yaml:10:\d+: geo\.limit_key: "\$limit_key" is defined twice', text), text
    assert re.search(r"conf\.yaml:12:\d+: geo\.g2\.values\.10\.0\.0\.300/8: not an IP address", text), text
    assert re.search(r"conf\.yaml:15:\d+: geo\.g3\.values: range \"10\.0\.0\.5-10\.0\.0\.20\" overlaps", text), text
    assert re.search(r'conf\.yaml:19:\d+: routes\[0\]\.proxy_set_header\.X-Key: unknown "undefined_map"', text), text


def test_cycles_binary_values_in_texts_and_bad_wildcards_are_errors():
    found = "\n".join(
        errors(
            """maps:
  a: {source: $b}
  b: {source: $a}
  bin: {source: $uri, default: $binary_remote_addr}
  h: {source: $host, hostnames: true, values: {"w*w.example.com": x}}
  d: {source: $uri, values: {default: x}}
  n: {source: $uri, values: {"1": }}
routes:
  - location: /
    upstream: app
    add_header: [{name: X-B, value: $bin}]
"""
        )
    )
    assert "a cycle of maps: $a -> $b -> $a" in found or "a cycle of maps: $b -> $a -> $b" in found, found
    assert 'routes[0].add_header[0].value: "$bin" can hold $binary_remote_addr' in found, found
    assert "maps.h.values.w*w.example.com: invalid wildcard" in found, found
    assert "maps.d.values.default: write default: beside values:" in found, found
    assert "maps.n.values.1: expected a text" in found, found


def test_ipv6_prefix_on_a_key_of_a_map_without_addresses_is_an_error():
    found = "\n".join(
        errors(
            """maps:
  m: {source: $uri, default: x}
zones:
  z: {type: req, key: $m, rate: 1r/s, ipv6_prefix: 64}
routes:
  - {location: /, upstream: app}
"""
        )
    )
    assert "zones.z.ipv6_prefix: ipv6_prefix only changes" in found


def test_map_regex_with_a_posix_class_is_the_bot_blocker_idiom():
    variables = (
        'maps:\n  probe:\n    source: $http_user_agent\n    default: "0"\n    values: {"~*^[[:alpha:]]+bot": "1"}\n'
    )
    assert probe(variables, context(headers={"User-Agent": "EvilBot/1"})) == b"1"
    assert probe(variables, context(headers={"User-Agent": "9bot"})) == b"0"
