"""allow/deny at the http, server and location levels against the real nginx, request by request.

One nginx configuration; two gateways: one configured by hand with the same lists, one with
what ``gateway import-nginx`` makes of nginx's file. The same schedule goes to the three,
each request from its own client address: a loopback source address (127.0.0.0/8), or, from
127.0.0.1 (trusted by realip in all three), an ``X-Real-IP`` naming an IPv4, IPv6 or mapped
IPv4 (``::ffff:a.b.c.d``) client. The limit is 1r/m, so no status depends on timing; one
zone shows nginx's phase order (the limit counts a denied client before its 403) and one
``return`` that it answers before any list is read. One location adds ``X-Request-ID
$request_id`` to its answers: nginx's shape (32 lowercase hex digits), a new one each time.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
import pytest
import yaml

from gateway.nginxconf.emit import render
from gateway.nginxconf.parser import parse_config
from gateway.nginxconf.translate import translate
from tests.support.gateway import Gateway
from tests.support.nginx import NginxProcess, find_nginx, single_worker_conf
from tests.support.ports import free_port
from tests.support.upstreams import Upstream


def nginx_conf(d: Path, port: int, upstream: str) -> str:
    app = f"proxy_pass http://{upstream};"
    return single_worker_conf(
        d,
        f"""    access_log off;
    set_real_ip_from 127.0.0.1;
    real_ip_header X-Real-IP;
    limit_req_zone $binary_remote_addr zone=one:1m rate=1r/m;
    deny 192.0.2.1;
    deny 2001:db8:bad::/48;
    server {{
        listen 127.0.0.1:{port};
        server_name a.test;
        allow 10.0.0.0/8;
        allow 127.0.0.0/29;
        allow 2001:db8::/32;
        deny all;
        location / {{ add_header X-Request-ID $request_id always; {app} }}
        location /open/ {{ allow all; {app} }}
        location /lan/ {{
            deny 10.1.0.0/16;
            allow 10.0.0.0/8;
            deny all;
            {app}
            location /lan/inner/ {{ {app} }}
            location /lan/own/ {{ allow 10.1.2.3; deny all; {app} }}
        }}
        location /limited/ {{ limit_req zone=one; {app} }}
        location /ret/ {{ return 200 "answered"; }}
    }}
    server {{
        listen 127.0.0.1:{port};
        server_name b.test;
        location / {{ {app} }}
        location /v6/ {{ deny 2001:db8::1; allow ::/0; deny 10.0.0.0/8; {app} }}
    }}
""",
    )


def gateway_yaml(port: int, upstream: str) -> str:
    return f"""
listen: 127.0.0.1:{port}
admin: {{listen: "off"}}
shutdown_timeout: 2s
real_ip: {{from: [127.0.0.1], header: X-Real-IP}}
upstreams:
  app: {{servers: [{upstream}]}}
zones:
  one: {{type: req, key: $binary_remote_addr, rate: 1r/m}}
access: [{{deny: 192.0.2.1}}, {{deny: "2001:db8:bad::/48"}}]
servers:
  - server_name: a.test
    access: [{{allow: 10.0.0.0/8}}, {{allow: 127.0.0.0/29}}, {{allow: "2001:db8::/32"}}, {{deny: all}}]
    routes:
      - {{location: /, upstream: app, add_header: [{{name: X-Request-ID, value: $request_id, always: true}}]}}
      - {{location: /open/, upstream: app, access: [{{allow: all}}]}}
      - location: /lan/
        upstream: app
        access: &lan [{{deny: 10.1.0.0/16}}, {{allow: 10.0.0.0/8}}, {{deny: all}}]
      - {{location: /lan/inner/, upstream: app, access: *lan}}
      - {{location: /lan/own/, upstream: app, access: [{{allow: 10.1.2.3}}, {{deny: all}}]}}
      - {{location: /limited/, upstream: app, limit_req: [{{zone: one}}]}}
      - {{location: /ret/, return: {{code: 200, text: answered}}}}
  - server_name: b.test
    routes:
      - {{location: /, upstream: app}}
      - location: /v6/
        upstream: app
        access: [{{deny: "2001:db8::1"}}, {{allow: "::/0"}}, {{deny: 10.0.0.0/8}}]
"""


def imported_yaml(conf: Path, port: int) -> str:
    result = translate(parse_config(str(conf)))
    doc = yaml.safe_load(render(result, conf.name))
    doc["admin"] = {"listen": "off"}
    doc["shutdown_timeout"] = "2s"
    return yaml.safe_dump(doc, sort_keys=False)


# (source address, X-Real-IP or "", Host, path)
SCHEDULE = [
    ("127.0.0.2", "", "a.test", "/"),  # the peer itself: in 127.0.0.0/29
    ("127.0.0.9", "", "a.test", "/"),  # outside: deny all
    ("127.0.0.1", "10.1.2.3", "a.test", "/"),
    ("127.0.0.1", "192.0.2.1", "a.test", "/"),  # the http level's deny is not inherited: deny all
    ("127.0.0.1", "2001:db8::5", "a.test", "/"),
    ("127.0.0.1", "2001:db9::5", "a.test", "/"),
    ("127.0.0.1", "::ffff:10.9.9.9", "a.test", "/"),  # mapped IPv4: the IPv4 rules
    ("127.0.0.1", "::ffff:198.51.100.1", "a.test", "/"),
    ("127.0.0.1", "192.0.2.1", "a.test", "/open/x"),  # its own allow all
    ("127.0.0.1", "10.1.2.3", "a.test", "/lan/"),  # the deny of 10.1/16 comes first
    ("127.0.0.1", "10.2.0.1", "a.test", "/lan/"),
    ("127.0.0.1", "10.1.2.3", "a.test", "/lan/inner/"),  # inherits /lan/'s list
    ("127.0.0.1", "10.2.0.1", "a.test", "/lan/inner/"),
    ("127.0.0.1", "10.1.2.3", "a.test", "/lan/own/"),  # its own list replaces /lan/'s
    ("127.0.0.1", "10.2.0.1", "a.test", "/lan/own/"),
    ("127.0.0.1", "198.51.100.7", "a.test", "/limited/"),  # counted by the limit, then 403
    ("127.0.0.1", "198.51.100.7", "a.test", "/limited/"),  # the limit answers first: 503
    ("127.0.0.1", "198.51.100.7", "a.test", "/ret/"),  # return answers before the list
    ("127.0.0.1", "192.0.2.1", "b.test", "/"),  # b.test inherits the http level's list
    ("127.0.0.1", "192.0.2.2", "b.test", "/"),
    ("127.0.0.1", "2001:db8:bad::1", "b.test", "/"),
    ("127.0.0.1", "2001:db8:b0d::1", "b.test", "/"),
    ("127.0.0.1", "::ffff:192.0.2.1", "b.test", "/"),
    ("127.0.0.1", "2001:db8::1", "b.test", "/v6/"),
    ("127.0.0.1", "2001:db8::2", "b.test", "/v6/"),
    ("127.0.0.1", "10.0.0.1", "b.test", "/v6/"),
    ("127.0.0.1", "192.0.2.1", "b.test", "/v6/"),  # no rule for it: allowed, the http level's is replaced
]


async def run(port: int) -> list[tuple[int, str]]:
    """Each request's status, and the shape of its X-Request-ID ("id": 32 lowercase hex digits)."""
    answers = []
    made = []
    for source, real_ip, host, path in SCHEDULE:
        headers = {"Host": host, **({"X-Real-IP": real_ip} if real_ip else {})}
        connector = aiohttp.TCPConnector(force_close=True, local_addr=(source, 0))
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=10)) as session:
            async with session.get(f"http://127.0.0.1:{port}{path}", headers=headers) as resp:
                await resp.read()
                rid = resp.headers.get("X-Request-ID", "")
                made += [rid] if rid else []
                answers.append((resp.status, "id" if re.fullmatch(r"[0-9a-f]{32}", rid) else rid))
    assert len(set(made)) == len(made)  # never the same id twice
    return answers


def test_allow_deny_at_three_levels_decide_like_nginx(tmp_path: Path) -> None:
    binary = find_nginx()
    if binary is None:
        pytest.skip("nginx binary not found (differential tests need it)")
    upstream = Upstream("access").start()
    dirs = {name: tmp_path / name for name in ("nginx", "gateway", "imported")}
    for d in dirs.values():
        d.mkdir()
    nginx_port, gateway_port, imported_port = free_port(), free_port(), free_port()
    nginx = NginxProcess(binary, dirs["nginx"], nginx_conf(dirs["nginx"], nginx_port, upstream.address), nginx_port)
    # the importer reads nginx's file written for its own port
    source = dirs["imported"] / "nginx.conf"
    source.write_text(nginx_conf(dirs["imported"], imported_port, upstream.address))
    gateways = [
        Gateway(dirs["gateway"], gateway_yaml(gateway_port, upstream.address), gateway_port),
        Gateway(dirs["imported"], imported_yaml(source, imported_port), imported_port),
    ]
    try:
        nginx.start()
        for gw in gateways:
            gw.start()
        from_nginx = asyncio.run(run(nginx_port))
        from_gateways = [asyncio.run(run(gw.port)) for gw in gateways]
    finally:
        for gw in gateways:
            gw.stop()
        nginx.stop()
        upstream.stop()
    assert [status for status, _ in from_nginx] == [
        *(200, 403, 200, 403, 200, 403, 200, 403, 200),
        *(403, 200, 403, 200, 200, 403),
        *(403, 503, 200),
        *(403, 200, 403, 200, 403),
        *(403, 200, 403, 200),
    ]
    # add_header ... always: the route's 403s carry a request id too
    assert [shape for _, shape in from_nginx[:8]] == ["id"] * 8 and from_nginx[8][1] == ""
    assert from_gateways[0] == from_nginx
    assert from_gateways[1] == from_nginx
