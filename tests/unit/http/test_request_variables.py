"""``$request_id``, ``$server_name`` and ``$scheme`` in texts, map sources, zone keys and log formats."""

from __future__ import annotations

import re

import pytest
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from gateway.errors import ConfigErrors
from gateway.http.context import RequestContext
from gateway.http.realip import parse_addr
from gateway.http.templates import compile_value, parse_value
from gateway.logs.formats import unknown_variables
from gateway.plan import load_config_text

HEAD = "listen: 127.0.0.1:8080\nadmin: {listen: 'off'}\nupstreams: {app: {servers: [127.0.0.1:9000]}}\n"


def context(scheme: str = "http") -> RequestContext:
    peer = parse_addr("192.0.2.1")
    assert peer is not None
    return RequestContext(make_mocked_request("GET", "/", headers=CIMultiDict()), 0.0, peer, scheme, 80)


def test_request_id_is_made_on_first_use_and_then_kept() -> None:
    ctx = context()
    assert ctx.rid == ""  # a request that never names it never pays for it
    text = compile_value(parse_value("$request_id"))
    first = text(ctx)
    assert re.fullmatch(r"[0-9a-f]{32}", first) and ctx.rid == first
    assert text(ctx) == first == compile_value(parse_value("id=${request_id}"))(ctx)[3:]
    assert context().request_id != first  # 16 random bytes: another request, another id


def test_server_name_and_scheme_in_texts_map_sources_and_zone_keys() -> None:
    config = load_config_text(
        HEAD + "maps:\n  tier: {source: '$scheme:$server_name', default: other, values: {'https:a.test': secure}}\n"
        "zones:\n  per_site: {type: req, key: $server_name, rate: 1r/s}\n"
        "servers:\n  - server_name: [a.test, www.a.test]\n    routes:\n"
        "      - {location: /, upstream: app, limit_req: [{zone: per_site}],\n"
        "         add_header: [{name: X-Tier, value: $tier}, {name: X-Where, value: '$scheme://$server_name'}]}\n"
    )
    route = config.routes[0]
    ctx = context("https")
    ctx.server = config.servers[0]
    assert [h.value(ctx) for h in route.add_header] == ["secure", "https://a.test"]
    assert route.limit_req[0].key(ctx) == b"a.test"  # nginx's $server_name: the first name
    plain = context("http")
    plain.server = config.servers[0]
    assert route.add_header[0].value(plain) == "other"


def test_a_zone_keyed_by_request_id_is_refused() -> None:
    with pytest.raises(ConfigErrors) as info:
        load_config_text(
            HEAD + "zones:\n  z: {type: req, key: $request_id, rate: 1r/s}\nroutes: [{location: /, upstream: app}]\n"
        )
    assert "zones.z.key: $request_id is new for every request" in str(info.value)


def test_log_formats_know_the_three() -> None:
    assert unknown_variables("$request_id $server_name $scheme") == []
