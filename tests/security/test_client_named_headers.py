"""Headers in which a client names itself or the original URL do not reach the backend.

A backend behind the gateway that honours ``Forwarded``, ``True-Client-IP`` or
``X-Original-URL`` could be told any client or any path; ``X_Forwarded_For`` reaches a
backend that maps ``_`` to ``-`` (WSGI does) as ``X-Forwarded-For``. They are dropped, as
nginx drops underscore names (``underscores_in_headers off``); a route opts one in with
``proxy_set_header``, and ``underscores_in_headers: on`` passes the underscore names.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.support.upstreams import HeadEchoUpstream

ATTACK = (
    b"Forwarded: for=1.2.3.4\r\nTrue-Client-IP: 1.2.3.4\r\nX-Client-IP: 1.2.3.4\r\n"
    b"X-Cluster-Client-IP: 1.2.3.4\r\nX-Original-URL: /admin\r\nX-Rewrite-URL: /admin\r\n"
    b"X_Forwarded_For: 1.2.3.4\r\nX_Real_IP: 1.2.3.4\r\n"
)


def fetch(port: int, path: str) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n".encode() + ATTACK + b"X-Ok: 1\r\n\r\n")
        while sock.recv(65536):
            pass


@pytest.fixture
def raw_upstream() -> Iterator[HeadEchoUpstream]:
    up = HeadEchoUpstream().start()
    yield up
    up.stop()


def names_seen(up: HeadEchoUpstream) -> set[str]:
    assert len(up.heads) == 1
    return {name.lower() for name, _ in up.heads[0]["headers"]}


def config(port: int, upstream: str, extra: str = "") -> str:
    return f"""
listen: 127.0.0.1:{port}
{extra}
upstreams:
  app: {{servers: [{upstream}]}}
routes:
  - location: /opt-in
    upstream: app
    proxy_set_header: {{Forwarded: $http_forwarded}}
  - location: /
    upstream: app
"""


def test_client_named_headers_are_dropped(gateway_factory, raw_upstream):
    gw = gateway_factory(lambda port: config(port, raw_upstream.address))
    fetch(gw.port, "/x")
    seen = names_seen(raw_upstream)
    assert "x-ok" in seen
    dropped = {"forwarded", "true-client-ip", "x-client-ip", "x-cluster-client-ip", "x-original-url", "x-rewrite-url"}
    assert not seen & dropped
    assert not {name for name in seen if "_" in name}


def test_a_route_opts_in_with_proxy_set_header(gateway_factory, raw_upstream):
    gw = gateway_factory(lambda port: config(port, raw_upstream.address))
    fetch(gw.port, "/opt-in")
    head = raw_upstream.heads[0]
    assert ("Forwarded", "for=1.2.3.4") in [tuple(h) for h in head["headers"]]
    assert "true-client-ip" not in names_seen(raw_upstream)


def test_underscores_in_headers_on_passes_them(gateway_factory, raw_upstream):
    gw = gateway_factory(lambda port: config(port, raw_upstream.address, "underscores_in_headers: on"))
    fetch(gw.port, "/x")
    assert {"x_forwarded_for", "x_real_ip"} <= names_seen(raw_upstream)
