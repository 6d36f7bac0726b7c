"""``$host`` and ``$cookie_NAME`` against the real nginx: the same raw requests, the same answers.

One nginx and one gateway with the same two guards (``if ($host = "evil.example")``,
``if ($cookie_admin = "yes")``) and both variables shown in response headers, in brackets so
that a space kept in a value shows. Each request goes as bytes over its own connection: a
Host with a trailing dot or a port, Cookie headers with spaces around ``=``, ``,`` and ``;``
separators, quotes, repeated names and repeated headers. nginx's answers are written out
too, so the table says what nginx 1.22 does, not only that the gateway agrees.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support.gateway import Gateway
from tests.support.nginx import NginxProcess, find_nginx, single_worker_conf
from tests.support.ports import free_port
from tests.support.upstreams import Upstream


def nginx_http(port: int, upstream: str) -> str:
    return f"""
    access_log off;
    server {{
        listen 127.0.0.1:{port};
        if ($host = "evil.example") {{ return 403; }}
        if ($cookie_admin = "yes") {{ return 409; }}
        location / {{
            add_header X-C "[$cookie_admin]" always;
            add_header X-H "[$host]" always;
            proxy_pass http://{upstream};
        }}
    }}
"""


def gateway_yaml(port: int, upstream: str) -> str:
    return f"""
listen: 127.0.0.1:{port}
admin: {{listen: "off"}}
shutdown_timeout: 2s
upstreams:
  app: {{servers: [{upstream}]}}
rules:
  - {{if: '$host = "evil.example"', return: 403}}
  - {{if: '$cookie_admin = "yes"', return: 409}}
routes:
  - location: /
    upstream: app
    add_header:
      - {{name: X-C, value: "[$cookie_admin]", always: true}}
      - {{name: X-H, value: "[$host]", always: true}}
"""


# (Host, Cookie headers) -> nginx's (status, X-C, X-H); "-" when the header is not there
CASES: list[tuple[str, tuple[str, ...], tuple[int, str, str]]] = [
    ("good.example", (), (200, "[]", "[good.example]")),
    ("evil.example", (), (403, "-", "-")),
    ("evil.example.", (), (403, "-", "-")),  # one trailing dot: the same name
    ("EVIL.Example.:8080", (), (403, "-", "-")),
    ("good.example.", (), (200, "[]", "[good.example]")),
    ("Good.Example.:81", (), (200, "[]", "[good.example]")),
    ("evil.example..", (), (400, "-", "-")),
    ("[::1].", (), (200, "[]", "[[::1]]")),  # a dot after a literal is no part of the name
    ("good.example", ("admin=yes",), (409, "-", "-")),
    ("good.example", ("admin = yes",), (409, "-", "-")),
    ("good.example", ("Admin=yes",), (409, "-", "-")),
    ("good.example", ("a=1;admin=yes",), (409, "-", "-")),
    ("good.example", ("a=1, admin=yes",), (409, "-", "-")),
    ("good.example", ("a=1", "admin=yes"), (409, "-", "-")),
    ("good.example", ("admin=no; admin=yes",), (200, "[no]", "[good.example]")),  # the first wins
    ("good.example", ("admin=no", "admin=yes"), (200, "[no]", "[good.example]")),
    ("good.example", ('admin="yes"',), (200, '["yes"]', "[good.example]")),  # quotes are kept
    ("good.example", ("admin=yes ; b=2",), (200, "[yes ]", "[good.example]")),
    ("good.example", ("admin=yes, b=2",), (200, "[yes, b=2]", "[good.example]")),  # "," does not end it
    ("good.example", ("admin;admin=yes",), (200, "[]", "[good.example]")),
    ("good.example", ("adminx=1; admin=2",), (200, "[2]", "[good.example]")),
    ("good.example", ("xadmin=1",), (200, "[]", "[good.example]")),
    ("good.example", ("admin",), (200, "[]", "[good.example]")),
    ("good.example", ("admin=",), (200, "[]", "[good.example]")),
    ("good.example", ('a="x;admin=yes"',), (200, '[yes"]', "[good.example]")),  # nor do quotes hide a ";"
]


def ask(port: int, host: str, cookies: tuple[str, ...]) -> tuple[int, str, str]:
    head = f"GET / HTTP/1.1\r\nHost: {host}\r\n" + "".join(f"Cookie: {c}\r\n" for c in cookies)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall((head + "Connection: close\r\n\r\n").encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    lines = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        fields.setdefault(name.strip().lower(), value.strip(" "))
    return int(lines[0].split(" ")[1]), fields.get("x-c", "-"), fields.get("x-h", "-")


def test_host_and_cookie_variables_read_like_nginx(tmp_path: Path) -> None:
    binary = find_nginx()
    if binary is None:
        pytest.skip("nginx binary not found (differential tests need it)")
    upstream = Upstream("hostcookie").start()
    nginx_dir, gateway_dir = tmp_path / "nginx", tmp_path / "gateway"
    nginx_dir.mkdir()
    gateway_dir.mkdir()
    nginx_port, gateway_port = free_port(), free_port()
    nginx = NginxProcess(
        binary, nginx_dir, single_worker_conf(nginx_dir, nginx_http(nginx_port, upstream.address)), nginx_port
    )
    gateway = Gateway(gateway_dir, gateway_yaml(gateway_port, upstream.address), gateway_port)
    try:
        nginx.start()
        gateway.start()
        from_nginx = [ask(nginx_port, host, cookies) for host, cookies, _ in CASES]
        from_gateway = [ask(gateway_port, host, cookies) for host, cookies, _ in CASES]
    finally:
        gateway.stop()
        nginx.stop()
        upstream.stop()
    table = [(host, cookies) for host, cookies, _ in CASES]
    assert list(zip(table, from_nginx, strict=True)) == [((h, c), want) for h, c, want in CASES]
    assert list(zip(table, from_gateway, strict=True)) == list(zip(table, from_nginx, strict=True))
