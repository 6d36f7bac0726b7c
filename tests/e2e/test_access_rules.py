"""nginx's allow/deny at the top, server and route levels, and ``$request_id``, through the CLI.

The client address comes from ``X-Real-IP`` sent from loopback (trusted by ``real_ip``), so
one test can be IPv4, IPv6 and mapped IPv4 clients. The order is nginx's: a ``return`` answers
before the list is read, and the limits count a denied client before it gets its 403.
"""

from __future__ import annotations

import re

from tests.support.config import config
from tests.support.http import get

TOP = """shutdown_timeout: 5s
real_ip: {from: [127.0.0.1], header: X-Real-IP}
log: {format: '$remote_addr $status $request_id "$server_name" $scheme'}
access: [{deny: 192.0.2.1}]"""

ZONES = "  one: {type: req, key: $binary_remote_addr, rate: 1r/m}"

SERVERS = """servers:
  - server_name: a.test
    access: [{allow: 10.0.0.0/8}, {allow: "2001:db8::/32"}, {deny: all}]
    routes:
      - location: /
        upstream: app
        proxy_set_header: {X-Request-ID: $request_id, X-Scheme: $scheme, X-Server: $server_name}
        add_header: [{name: X-Request-ID, value: $request_id}]
      - {location: /open/, upstream: app, access: [{allow: all}]}
      - {location: /limited/, upstream: app, limit_req: [{zone: one}]}
      - {location: /ret/, return: {code: 200, text: "id=$request_id"}}
  - server_name: b.test
    routes:
      - {location: /, upstream: app}
"""

# (Host, path, client address, expected status)
CASES = [
    ("a.test", "/", "10.1.2.3", 200),
    ("a.test", "/", "2001:db8::5", 200),
    ("a.test", "/", "::ffff:10.9.9.9", 200),  # a mapped IPv4 client meets the IPv4 rule
    ("a.test", "/", "198.51.100.1", 403),
    ("a.test", "/", "2001:db9::1", 403),
    ("a.test", "/open/", "192.0.2.1", 200),  # the route's own list: the top level's deny is not inherited
    ("b.test", "/", "192.0.2.1", 403),  # b.test has no list: the top level's, whole
    ("b.test", "/", "198.51.100.1", 200),
    ("a.test", "/limited/", "198.51.100.1", 403),  # counted by the limit, then denied
    ("a.test", "/limited/", "198.51.100.1", 503),  # the limit answers first, as nginx's preaccess phase
    ("a.test", "/ret/", "198.51.100.1", 200),  # return (the rewrite phase) answers before the list
]


async def test_allow_deny_at_three_levels_in_nginx_order(gateway_factory, upstream):
    gw = gateway_factory(config(upstream, top=TOP, zones=ZONES, routes="", admin="{listen: 'off'}", extra=SERVERS))
    got = []
    for host, path, client, _ in CASES:
        reply = await get(f"{gw.url}{path}", headers={"Host": host, "X-Real-IP": client})
        got.append(reply.status)
    assert got == [expected for *_, expected in CASES]
    assert "access forbidden by rule" in gw.stderr()
    statuses = [line.split()[1] for line in gw.access_lines()]
    assert statuses == [str(expected) for *_, expected in CASES]


async def test_request_id_is_one_value_per_request_everywhere_it_is_used(gateway_factory, upstream):
    gw = gateway_factory(config(upstream, top=TOP, zones=ZONES, routes="", admin="{listen: 'off'}", extra=SERVERS))
    ids = []
    for _ in range(2):
        reply = await get(f"{gw.url}/x", headers={"Host": "a.test", "X-Real-IP": "10.0.0.1"})
        assert reply.status == 200
        sent = dict(reply.json()["headers"])
        assert sent["X-Scheme"] == "http" and sent["X-Server"] == "a.test"
        assert re.fullmatch(r"[0-9a-f]{32}", sent["X-Request-ID"])
        assert reply.headers["X-Request-ID"] == sent["X-Request-ID"]  # the upstream's and the client's
        ids.append(sent["X-Request-ID"])
    text = (await get(f"{gw.url}/ret/", headers={"Host": "a.test"})).text
    ids.append(text.removeprefix("id="))
    lines = gw.access_lines()
    assert [line.split()[2] for line in lines] == ids  # ... and the log line's
    assert len(set(ids)) == 3 and re.fullmatch(r"[0-9a-f]{32}", ids[2])
    assert all(line.endswith('"a.test" http') for line in lines)
