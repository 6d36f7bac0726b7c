"""No client byte can wipe, split or forge an access log line, in any format.

For every byte value, one request carries it in every logged header field (User-Agent,
Referer, X-Forwarded-For, the Basic user) and one in the target (path and query), through
the gateway started by its CLI with each log format in turn. The log must hold exactly one
line per request, in order, each line whole: a JSON object for ``json``, the preset's
shape for the others (no field ended early by a quote, no line split by a newline).
Before this test, one ``User-Agent: \\xff`` made the ``json`` writer drop its whole batch.
"""

from __future__ import annotations

import base64
import json
import re
import socket

import pytest

FORMATS = {
    "combined": re.compile(r'^\S+ - \S+ \[[^\]]+\] "[^"]*" \d{3} \d+ "[^"]*" "[^"]*"$'),
    "main": re.compile(r'^\S+ - \S+ \[[^\]]+\] "[^"]*" \d{3} \d+ "[^"]*" "[^"]*" "[^"]*"$'),
    "gateway": re.compile(r'^\S+ - \S+ \[[^\]]+\] "[^"]*" \d{3} \d+ "[^"]*" "[^"]*" rt=\S+ ua="[^"]*" us=\S+ ut=\S+ '
                          r"lreq=\S+ lconn=\S+ lcount=\S+$"),
    "json": None,
    '"$request" "$http_user_agent" "$remote_user" "$args" "$uri" "$request_uri" "$host"':
        re.compile(r'^"[^"]*" "[^"]*" "[^"]*" "[^"]*" "[^"]*" "[^"]*" "[^"]*"$'),
}  # fmt: skip


def requests_for(byte: int) -> list[bytes]:
    b = bytes([byte])
    user = base64.b64encode(b"u" + b + b"x:pw")
    headers = (
        b"GET /h HTTP/1.1\r\nHost: a\r\nUser-Agent: ua" + b + b"x\r\nReferer: r" + b + b"x\r\n"
        b"X-Forwarded-For: 1.2.3.4" + b + b"\r\nAuthorization: Basic " + user + b"\r\nConnection: close\r\n\r\n"
    )
    target = b"GET /p" + b + b"x?q=" + b + b"y HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
    return [headers, target]


def send(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(5)
        sock.sendall(data)
        try:
            while sock.recv(65536):
                pass
        except (TimeoutError, ConnectionResetError):
            pass


@pytest.mark.parametrize("fmt", list(FORMATS), ids=["combined", "main", "gateway", "json", "template"])
def test_every_byte_in_every_logged_field_gives_one_whole_line(gateway_factory, upstream, tmp_path, fmt):
    log = tmp_path / "access.log"
    gw = gateway_factory(
        lambda port: (
            f"""
listen: 127.0.0.1:{port}
upstreams:
  app: {{servers: [{upstream.address}]}}
routes:
  - location: /
    upstream: app
log:
  access: {log}
  format: {json.dumps(fmt)}
"""
        )
    )
    sent = 0
    for byte in range(256):
        for request in requests_for(byte):
            send(gw.port, request)
            sent += 1
    gw.stop()
    raw = log.read_bytes()
    text = raw.decode("utf-8")  # the whole file is valid UTF-8
    lines = text.split("\n")
    assert lines[-1] == ""
    lines = lines[:-1]
    assert len(lines) == sent, f"{sent} requests, {len(lines)} lines"
    shape = FORMATS[fmt]
    for line in lines:
        if shape is None:
            record = json.loads(line)
            assert isinstance(record, dict) and "status" in record
        else:
            assert shape.match(line), line
