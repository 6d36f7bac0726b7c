"""Requests that would route on one thing and reach the backend as another are refused.

Each attack goes over a real socket to the gateway started through its CLI, in front of a
raw upstream that records what reached it: the assertion is both the status and that the
upstream saw nothing. The answers are nginx's (``ngx_http_validate_host``, the request-line
parser, 501 for a transfer coding it does not know), except ``#`` in a target, which nginx
cuts off and we refuse: a fragment has no place in a request (RFC 9112 §3.2).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.http import exchange
from tests.support.upstreams import HeadEchoUpstream


def status(response: bytes) -> int:
    return int(response.split(b"\r\n", 1)[0].split(b" ")[1])


def config(port: int, upstream: str) -> str:
    return f"""
listen: 127.0.0.1:{port}
upstreams:
  app:
    servers: [{upstream}]
zones:
  login: {{type: req, key: $binary_remote_addr, rate: 1r/m}}
routes:
  - location: = /admin
    return: {{code: 403}}
  - location: /admin/
    return: {{code: 403}}
  - location: /login
    upstream: app
    limit_req: [{{zone: login}}]
  - location: /
    upstream: app
"""


@pytest.fixture
def raw_upstream() -> Iterator[HeadEchoUpstream]:
    up = HeadEchoUpstream().start()
    yield up
    up.stop()


@pytest.fixture
def gw(gateway_factory, raw_upstream):
    return gateway_factory(lambda port: config(port, raw_upstream.address))


@pytest.mark.parametrize(
    "target",
    ["/admin/secret#/../../public", "/admin#", "/admin#/../public", "/public#x", "/#", "/x?y=1#frag"],
)
def test_a_fragment_in_the_target_is_refused_and_reaches_no_backend(gw, raw_upstream, target):
    response = exchange(gw.port, f"GET {target} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
    assert status(response) == 400
    assert raw_upstream.heads == []


def test_a_fragment_does_not_escape_a_rate_limit(gw, raw_upstream):
    answers = [status(exchange(gw.port, b"GET /login#/../x HTTP/1.1\r\nHost: a\r\n\r\n")) for _ in range(5)]
    assert answers == [400] * 5
    assert raw_upstream.heads == []
    first = status(exchange(gw.port, b"GET /login HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"))
    second = status(exchange(gw.port, b"GET /login HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"))
    assert (first, second) == (200, 503)  # the limit is whole: the refused requests cost nothing


@pytest.mark.parametrize(
    "head",
    [
        b"GET / HTTP/1.1\r\nHost: a/../b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a..b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\\b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: \r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: .\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\n",  # HTTP/1.1 needs a Host
        b"GET http://u:p@evil.example/ HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET http://evil.example/../x/ HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET http://a/b/HTTP/1.1\r\n\r\n",
    ],
)
def test_hosts_and_authorities_nginx_refuses_are_refused(gw, raw_upstream, head):
    response = exchange(gw.port, head)
    assert status(response) == 400, response[:200]
    assert raw_upstream.heads == []


@pytest.mark.parametrize(
    "head",
    [
        b"GET / HTTP/1.1\r\nHost: example.org\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: example.org.\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: Example.ORG:8080\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
        b"GET / HTTP/1.0\r\n\r\n",  # HTTP/1.0 may leave Host out
        b"GET http://example.org/x HTTP/1.1\r\nHost: other\r\n\r\n",
    ],
)
def test_ordinary_hosts_pass(gw, raw_upstream, head):
    assert status(exchange(gw.port, head)) == 200


@pytest.mark.parametrize(
    "coding, expected",
    [(b"gzip, chunked", 501), (b"deflate", 501), (b"identity", 501), (b"chunked", 200), (b"Chunked", 200)],
)
def test_a_transfer_coding_other_than_chunked_gets_501(gw, raw_upstream, coding, expected):
    head = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: " + coding + b"\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    response = exchange(gw.port, head)
    assert status(response) == expected, response[:200]
    if expected != 200:
        assert raw_upstream.heads == []


def test_many_headers_within_nginxs_default_buffers_pass(gw, raw_upstream):
    """200 headers, 20 kB in all: within large_client_header_buffers 4 8k, as nginx takes them."""
    fields = b"".join(b"X-Field-%03d: " % i + b"v" * 84 + b"\r\n" for i in range(200))
    response = exchange(gw.port, b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n" + fields + b"\r\n")
    assert status(response) == 200
    assert len(raw_upstream.heads) == 1


def test_a_header_over_the_four_buffers_is_refused(gw, raw_upstream):
    fields = b"".join(b"X-Field-%03d: " % i + b"v" * 200 + b"\r\n" for i in range(200))  # 42 kB > 32 kB
    response = exchange(gw.port, b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n" + fields + b"\r\n")
    assert status(response) in (400, 431)
    assert raw_upstream.heads == []


@pytest.mark.parametrize(
    ("target", "upstream_target"),
    [
        ("/x/..%2fpublic", "/public"),
        ("//public?q=1", "/public?q=1"),
        ("/a/%2e%2e/b%20c", "/b%20c"),
        ("/a/./b/", "/a/b/"),
        ("/plain/path?x=%2F..", "/plain/path?x=%2F.."),  # the query goes as it came
        ("/public;jsessionid=1", "/public;jsessionid=1"),  # stripping the parameter routes the same
        ("/caf%C3%A9", "/caf%C3%A9"),
    ],
)
def test_the_upstream_gets_the_path_the_gateway_routed_on(gw, raw_upstream, target, upstream_target):
    response = exchange(gw.port, f"GET {target} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n".encode())
    assert status(response) == 200
    assert [head["target"] for head in raw_upstream.heads] == [upstream_target]


@pytest.mark.parametrize(
    "target",
    [
        "/admin;x=y",  # Tomcat and Spring serve /admin
        "/public/..;/admin/x",
        "/login;a/..;/admin/",  # the Tomcat reading climbs out of /login
        "/public\\..\\admin/",  # IIS and WHATWG parsers serve /admin/
        "/%5cadmin/",
        "/%252e%252e/admin",  # a backend that decodes twice serves /admin
        "/x/%252f..%252fadmin",
        "/%c0%ae%c0%ae/admin",  # overlong UTF-8: old decoders read ..
    ],
)
def test_a_target_a_backend_would_route_elsewhere_is_refused(gw, raw_upstream, target):
    response = exchange(gw.port, f"GET {target} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n".encode())
    assert status(response) == 400, response[:200]
    assert raw_upstream.heads == []
