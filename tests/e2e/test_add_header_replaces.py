"""``add_header`` on ``ETag`` and ``Last-Modified`` replaces the response's own, and an empty
value removes it; ``Cache-Control`` and ``Link`` are appended. Checked against nginx itself:
one nginx serves as the upstream (it sends all four headers) and, on a second port, as the
reference proxy with the same ``add_header`` lines as the gateway's route."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.config import config
from tests.support.nginx import NginxProcess, find_nginx, single_worker_conf
from tests.support.ports import free_port

UPSTREAM_HEADERS = {
    "etag": '"up-1"',
    "last-modified": "Tue, 01 Jan 2030 00:00:00 GMT",
    "cache-control": "max-age=60",
    "link": "</up.css>; rel=preload",
}
COMPARED = ("etag", "last-modified", "cache-control", "link", "x-plain")

NGINX_HTTP = """    access_log off;
    server {{
        listen 127.0.0.1:{up};
        location / {{
            add_header ETag '"up-1"';
            add_header Last-Modified "Tue, 01 Jan 2030 00:00:00 GMT";
            add_header Cache-Control "max-age=60";
            add_header Link "</up.css>; rel=preload";
            return 200 "up";
        }}
    }}
    server {{
        listen 127.0.0.1:{ref};
        location /replace/ {{
            add_header ETag '"mine-$arg_v"';
            add_header Last-Modified "Wed, 02 Jan 2030 00:00:00 GMT";
            add_header Cache-Control no-store;
            add_header Link "</mine.js>; rel=preload";
            add_header X-Plain "";
            proxy_pass http://127.0.0.1:{up};
        }}
        location /remove/ {{
            add_header ETag "";
            add_header Last-Modified "";
            proxy_pass http://127.0.0.1:{up};
        }}
        location /variable/ {{
            add_header ETag $arg_tag;
            proxy_pass http://127.0.0.1:{up};
        }}
        location = /own {{
            add_header ETag '"own"';
            return 200 "own";
        }}
    }}
"""

ROUTES = """
  - location: /replace/
    upstream: app
    add_header:
      - {name: ETag, value: '"mine-$arg_v"'}
      - {name: Last-Modified, value: "Wed, 02 Jan 2030 00:00:00 GMT"}
      - {name: Cache-Control, value: no-store}
      - {name: Link, value: "</mine.js>; rel=preload"}
      - {name: X-Plain, value: ""}
  - location: /remove/
    upstream: app
    add_header: [{name: ETag, value: ""}, {name: Last-Modified, value: ""}]
  - location: /variable/
    upstream: app
    add_header: [{name: ETag, value: $arg_tag}]
  - location: = /own
    return: {code: 200, text: own}
    add_header: [{name: ETag, value: '"own"'}]
"""

TARGETS = ("/replace/a?v=2", "/remove/a", "/variable/a?tag=t9", "/variable/a", "/own")


async def headers_of(port: int, target: str) -> list[tuple[str, str]]:
    """The compared header fields of one response, in order, names in lower case."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {target} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    out = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head = out.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    assert head[0].split(" ")[1] == "200", head
    fields = [line.split(":", 1) for line in head[1:]]
    return [(name.lower(), value.strip()) for name, value in fields if name.lower() in COMPARED]


async def test_add_header_replaces_etag_and_last_modified_as_nginx_does(tmp_path: Path, gateway_factory):
    binary = find_nginx()
    if binary is None:
        pytest.skip("nginx binary not found")
    up, ref = free_port(), free_port()
    conf = single_worker_conf(tmp_path, NGINX_HTTP.format(up=up, ref=ref), worker_connections=64)
    nginx = NginxProcess(binary, tmp_path, conf, ref)
    nginx.start()
    try:
        gw = gateway_factory(
            config(f"127.0.0.1:{up}", top="shutdown_timeout: 5s", routes=ROUTES, admin="{listen: 'off'}")
        )
        for target in TARGETS:
            theirs = await headers_of(ref, target)
            ours = await headers_of(gw.port, target)
            assert sorted(ours) == sorted(theirs), target
        # and what that is, spelled out
        replaced = dict(await headers_of(gw.port, "/replace/a?v=2"))
        assert replaced["etag"] == '"mine-2"' and replaced["last-modified"] == "Wed, 02 Jan 2030 00:00:00 GMT"
        both = [v for k, v in await headers_of(gw.port, "/replace/a?v=2") if k == "cache-control"]
        assert both == ["max-age=60", "no-store"]  # appended, after the upstream's
        removed = dict(await headers_of(gw.port, "/remove/a"))
        assert "etag" not in removed and "last-modified" not in removed
        assert removed["cache-control"] == UPSTREAM_HEADERS["cache-control"]
        assert dict(await headers_of(gw.port, "/variable/a")).get("etag") is None  # empty variable: removed
    finally:
        nginx.stop()
