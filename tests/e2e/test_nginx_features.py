"""nginx features through the CLI-started gateway and a real upstream: proxy_pass with a URI,
proxy_set_header, add_header and return routes."""

from __future__ import annotations

import asyncio

from tests.support.config import config
from tests.support.http import request
from tests.support.upstreams import Upstream


async def raw(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    out = await asyncio.wait_for(reader.read(65536), 5)
    writer.close()
    return out


def seen(upstream: Upstream, index: int = -1) -> dict[str, str]:
    return {k.lower(): v for k, v in upstream.seen[index]["headers"]}


TOP = "shutdown_timeout: 5s"
APP = "read_timeout: 2s"


URI_ROUTES = """
  - location: /api/
    upstream: app
    uri: /v1/
  - location: = /exact
    upstream: app
    uri: /other/place
  - location: /plain/
    upstream: app
  - location: ^~ /root/
    upstream: app
    uri: /
"""


async def test_proxy_pass_uri_replaces_the_matched_prefix(gateway_factory, upstream):
    gw = gateway_factory(config(upstream, top=TOP, upstream_options=APP, routes=URI_ROUTES))
    cases = [
        (b"/api/users?x=1", "/v1/users?x=1"),
        (b"/api/", "/v1/"),
        (b"/api//a/./b/../c", "/v1/a/c"),  # on the normalised URI, as nginx
        (b"/api/a%20b%3Fc%2Fd?q=%20", "/v1/a%20b%3Fc/d?q=%20"),  # re-escaped: space and ? escaped, / not
        (b"/api/%41%7e", "/v1/A~"),  # unreserved bytes go decoded (nginx's NGX_ESCAPE_URI)
        (b"/api/caf%C3%A9", "/v1/caf%C3%A9"),
        (b"/exact?k=v", "/other/place?k=v"),  # an exact location: the whole URI replaced
        (b"/root/x", "/x"),
        (b"/plain/x/y;p?q=%2F..", "/plain/x/y;p?q=%2F.."),  # no uri, the path is $uri already: as sent
        (b"/plain//x/%41?y", "/plain/x/A?y"),  # no uri, the path is not $uri: $uri re-escaped, the query as sent
    ]
    for target, expected in cases:
        out = await raw(gw.port, b"GET " + target + b" HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 200"), (target, out[:80])
        assert upstream.seen[-1]["path"] == expected, target
    # the access log keeps what the client asked
    assert any('"GET /api/users?x=1 HTTP/1.1"' in line for line in gw.access_lines())


HEADER_ROUTES = """
  - location: /own/
    upstream: app
    proxy_set_header:
      Host: backend.internal
      X-Forwarded-For: $proxy_add_x_forwarded_for
      X-Tenant: "t-$arg_tenant-$http_x_user"
      X-Drop: ""
      Connection: close
  - location: /inherit/
    upstream: app
  - location: /added/
    upstream: app
    add_header:
      - {name: X-Frame-Options, value: DENY}
      - {name: X-Route, value: "$uri via $host", always: true}
  - location: /status/
    upstream: app
    add_header:
      - {name: X-Only-Ok, value: "1"}
      - {name: X-Always, value: "1", always: true}
"""

HEADER_DEFAULTS = """
defaults:
  proxy_set_header: {X-From-Defaults: "yes", X-Drop: ""}
"""


async def test_proxy_set_header_sets_removes_and_replaces_the_inherited_list(gateway_factory, upstream):
    gw = gateway_factory(config(upstream, top=TOP + HEADER_DEFAULTS, upstream_options=APP, routes=HEADER_ROUTES))
    headers = {"X-Drop": "secret", "X-User": "ann", "X-Forwarded-For": "9.9.9.9", "Host": "client.example"}
    status, _, _, _ = await request(
        "GET", gw.url + "/own/x?tenant=7", headers=headers, auto_decompress=False, allow_redirects=False
    )
    assert status == 200
    got = seen(upstream)
    assert got["host"] == "backend.internal"
    assert got["x-forwarded-for"] == "9.9.9.9, 127.0.0.1"  # the client's list, appended (nginx's variable)
    assert got["x-tenant"] == "t-7-ann"
    assert "x-drop" not in got  # an empty value removes the header
    assert "x-from-defaults" not in got  # the route's own list replaces the inherited one entirely
    assert got.get("connection", "keep-alive") != "close"  # framing headers stay the gateway's
    status, _, _, _ = await request(
        "GET", gw.url + "/inherit/x", headers=headers, auto_decompress=False, allow_redirects=False
    )
    got = seen(upstream)
    assert got["x-from-defaults"] == "yes" and "x-drop" not in got
    assert got["host"] == "client.example"  # unset Host: the client's, as before


async def test_add_header_on_listed_statuses_and_always_on_every_response(gateway_factory, upstream):
    gw = gateway_factory(config(upstream, top=TOP, upstream_options=APP, routes=HEADER_ROUTES))
    status, headers, _, _ = await request(
        "GET", gw.url + "/added/page", headers={"Host": "Site.Example"}, auto_decompress=False, allow_redirects=False
    )
    assert status == 200
    assert headers["X-Frame-Options"] == "DENY"
    assert headers["X-Route"] == "/added/page via site.example"
    status, headers, _, _ = await request("GET", gw.url + "/status/404", auto_decompress=False, allow_redirects=False)
    assert status == 404  # from the upstream: only the always header
    assert "X-Only-Ok" not in headers and headers["X-Always"] == "1"
    status, headers, _, _ = await request("GET", gw.url + "/status/204", auto_decompress=False, allow_redirects=False)
    assert status == 204 and headers["X-Only-Ok"] == "1"
    # the gateway's own answer (a 400 for a bad escape) gets only the always ones
    out = await raw(gw.port, b"GET /status/%zz HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400")
    # no route yet at that point: nothing added (nginx too answers 400 before the location)
    assert b"X-Always" not in out


RETURN_ROUTES = """
  - location: /old/
    return: {code: 301, url: "https://new.example$request_uri"}
  - location: = /gone
    return: {code: 410, text: "moved away for good"}
  - location: = /health
    return: {code: 204}
    add_header: [{name: X-Checked, value: "yes"}]
  - location: = /teapot
    return: {code: 418}
    add_header: [{name: X-Not, value: "no"}, {name: X-Yes, value: "yes", always: true}]
  - location: /
    upstream: app
"""


async def test_return_routes_answer_without_an_upstream(gateway_factory):
    # the only upstream is a closed port: a return route never touches it
    from tests.support.ports import free_port

    dead = Upstream("dead")
    dead.port = free_port()
    gw = gateway_factory(config(dead, top=TOP, upstream_options=APP, routes=RETURN_ROUTES))
    status, headers, body, _ = await request("GET", gw.url + "/old/a?b=1", auto_decompress=False, allow_redirects=False)
    assert status == 301 and headers["Location"] == "https://new.example/old/a?b=1"
    status, headers, body, _ = await request("GET", gw.url + "/gone", auto_decompress=False, allow_redirects=False)
    assert status == 410 and body == b"moved away for good" and headers["Content-Type"].startswith("text/plain")
    status, headers, body, _ = await request("GET", gw.url + "/health", auto_decompress=False, allow_redirects=False)
    assert status == 204 and body == b"" and headers["X-Checked"] == "yes"
    status, headers, _, _ = await request("GET", gw.url + "/teapot", auto_decompress=False, allow_redirects=False)
    assert status == 418 and "X-Not" not in headers and headers["X-Yes"] == "yes"
    status, _, _, _ = await request("GET", gw.url + "/other", auto_decompress=False, allow_redirects=False)
    assert status == 502


async def test_header_values_never_carry_a_line_break(gateway_factory, upstream):
    # an attacker's attempt: an encoded CR LF in a query argument used by a header template
    gw = gateway_factory(config(upstream, top=TOP, upstream_options=APP, routes=HEADER_ROUTES))
    out = await raw(
        gw.port, b"GET /own/x?tenant=a%0d%0aX-Injected:%201 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
    )
    assert out.startswith(b"HTTP/1.1 200")
    got = seen(upstream)
    assert "x-injected" not in got
    assert got["x-tenant"] == "t-a%0d%0aX-Injected:%201-"  # $arg_ is the raw (still escaped) value, as nginx
