"""``map`` and ``geo`` keys against the real nginx: the same requests, the same answers.

One nginx and one gateway, configured by hand with the same three idioms (the allowlist of
``geo`` + ``map``, a POST-only zone, a per-user-agent key) plus variables shown in
``add_header``; the same schedule goes to both, each request from its own client address in
127.0.0.0/8. Rates are 1r/m, so no decision depends on timing: statuses and headers must be
equal request by request.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from tests.support.gateway import Gateway
from tests.support.nginx import NginxProcess, find_nginx
from tests.support.ports import free_port
from tests.support.upstreams import Upstream


def nginx_conf(d: Path, port: int, upstream: str) -> str:
    return f"""daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 256; }}
http {{
    client_body_temp_path {d}/client_body_temp;
    proxy_temp_path {d}/proxy_temp;
    fastcgi_temp_path {d}/fastcgi_temp;
    uwsgi_temp_path {d}/uwsgi_temp;
    scgi_temp_path {d}/scgi_temp;
    access_log off;
    geo $limited {{ default 1; 127.0.0.0/29 0; 127.0.0.5/32 1; }}
    map $limited $limit_key {{ 0 ""; 1 $binary_remote_addr; }}
    map $request_method $post_key {{ POST $binary_remote_addr; default ""; }}
    map $http_user_agent $bot_key {{ default ""; "~*(bot|crawler|spider)" $http_user_agent; }}
    map $http_user_agent $agent_class {{ default human; "~*(?<kind>bot|spider)" "robot-$kind"; Curl/8 tool; }}
    map "$request_method:$limited" $pair {{ "GET:0" internal-get; default "other"; }}
    limit_req_zone $limit_key zone=allow:1m rate=1r/m;
    limit_req_zone $post_key zone=posts:1m rate=1r/m;
    limit_req_zone $bot_key zone=bots:1m rate=1r/m;
    limit_req_status 429;
    server {{
        listen 127.0.0.1:{port};
        location /allow/ {{
            limit_req zone=allow;
            add_header X-Limited $limited always;
            add_header X-Pair $pair always;
            proxy_pass http://{upstream};
        }}
        location /post/ {{ limit_req zone=posts; proxy_pass http://{upstream}; }}
        location /ua/ {{
            limit_req zone=bots;
            add_header X-Class $agent_class always;
            proxy_pass http://{upstream};
        }}
    }}
}}
"""


def gateway_yaml(port: int, upstream: str) -> str:
    return f"""
listen: 127.0.0.1:{port}
admin: {{listen: "off"}}
shutdown_timeout: 2s
geo:
  limited:
    default: "1"
    values: {{127.0.0.0/29: "0", 127.0.0.5/32: "1"}}
maps:
  limit_key: {{source: $limited, values: {{"0": "", "1": $binary_remote_addr}}}}
  post_key: {{source: $request_method, default: "", values: {{POST: $binary_remote_addr}}}}
  bot_key: {{source: $http_user_agent, default: "", values: {{"~*(bot|crawler|spider)": $http_user_agent}}}}
  agent_class:
    source: $http_user_agent
    default: human
    values: {{"~*(?<kind>bot|spider)": "robot-$kind", Curl/8: tool}}
  pair: {{source: "$request_method:$limited", default: other, values: {{"GET:0": internal-get}}}}
zones:
  allow: {{type: req, key: $limit_key, rate: 1r/m}}
  posts: {{type: req, key: $post_key, rate: 1r/m}}
  bots: {{type: req, key: $bot_key, rate: 1r/m}}
upstreams:
  app: {{servers: [{upstream}]}}
defaults:
  limit_req_status: 429
routes:
  - location: /allow/
    upstream: app
    limit_req: [{{zone: allow}}]
    add_header:
      - {{name: X-Limited, value: $limited, always: true}}
      - {{name: X-Pair, value: $pair, always: true}}
  - location: /post/
    upstream: app
    limit_req: [{{zone: posts}}]
  - location: /ua/
    upstream: app
    limit_req: [{{zone: bots}}]
    add_header: [{{name: X-Class, value: $agent_class, always: true}}]
"""


# (client address, method, path, User-Agent)
SCHEDULE = [
    ("127.0.0.2", "GET", "/allow/a", "x"),  # internal: never counted
    ("127.0.0.2", "GET", "/allow/b", "x"),
    ("127.0.0.2", "POST", "/allow/c", "x"),
    ("127.0.0.5", "GET", "/allow/d", "x"),  # the /32 exception inside the internal /29
    ("127.0.0.5", "GET", "/allow/e", "x"),
    ("127.0.1.9", "GET", "/allow/f", "x"),  # outside: one per minute
    ("127.0.1.9", "GET", "/allow/g", "x"),
    ("127.0.1.10", "GET", "/allow/h", "x"),
    ("127.0.2.1", "GET", "/post/a", "x"),  # GETs are never counted by the POST-only zone
    ("127.0.2.1", "GET", "/post/b", "x"),
    ("127.0.2.1", "POST", "/post/c", "x"),
    ("127.0.2.1", "POST", "/post/d", "x"),
    ("127.0.2.2", "POST", "/post/e", "x"),
    ("127.0.3.1", "GET", "/ua/a", "Mozilla/5.0 (X11)"),  # browsers: no key
    ("127.0.3.1", "GET", "/ua/b", "Mozilla/5.0 (X11)"),
    ("127.0.3.1", "GET", "/ua/c", "Mozilla/5.0 (compatible; Googlebot/2.1)"),
    ("127.0.3.2", "GET", "/ua/d", "Mozilla/5.0 (compatible; Googlebot/2.1)"),  # same agent, other address
    ("127.0.3.1", "GET", "/ua/e", "SomeSpider/1.0"),
    ("127.0.3.1", "GET", "/ua/f", "curl/8"),  # exact keys ignore case
]


async def run(port: int) -> list[tuple[int, str, str, str]]:
    answers = []
    for source, method, path, agent in SCHEDULE:
        connector = aiohttp.TCPConnector(force_close=True, local_addr=(source, 0))
        async with aiohttp.ClientSession(connector=connector) as session:
            async with session.request(
                method, f"http://127.0.0.1:{port}{path}", headers={"User-Agent": agent}, data=b"x"
            ) as resp:
                await resp.read()
                h = resp.headers
                answers.append((resp.status, h.get("X-Limited", "-"), h.get("X-Pair", "-"), h.get("X-Class", "-")))
    return answers


@pytest.mark.timing
def test_map_and_geo_keys_decide_like_nginx(tmp_path: Path) -> None:
    binary = find_nginx()
    if binary is None:
        pytest.skip("nginx binary not found (differential tests need it)")
    upstream = Upstream("mapgeo").start()
    nginx_dir, gateway_dir = tmp_path / "nginx", tmp_path / "gateway"
    nginx_dir.mkdir()
    gateway_dir.mkdir()
    nginx_port, gateway_port = free_port(), free_port()
    nginx = NginxProcess(binary, nginx_dir, nginx_conf(nginx_dir, nginx_port, upstream.address), nginx_port)
    gateway = Gateway(gateway_dir, gateway_yaml(gateway_port, upstream.address), gateway_port)
    try:
        nginx.start()
        gateway.start()
        from_nginx = asyncio.run(run(nginx_port))
        from_gateway = asyncio.run(run(gateway_port))
    finally:
        gateway.stop()
        nginx.stop()
        upstream.stop()
    assert [a[0] for a in from_nginx] == [
        *(200, 200, 200, 200, 429, 200, 429, 200),
        *(200, 200, 200, 429, 200),
        *(200, 200, 200, 429, 200, 200),
    ]
    assert from_nginx[0][1:] == ("0", "internal-get", "-") and from_nginx[2][2] == "other"
    assert [a[3] for a in from_nginx[13:]] == ["human", "human", "robot-bot", "robot-bot", "robot-Spider", "tool"]
    assert from_gateway == from_nginx
