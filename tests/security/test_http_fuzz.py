"""Random and mutated requests over a real socket, as a hostile client would send them.

Whatever arrives, the gateway must (1) never answer with a 5xx of its own (505 for an
unsupported version and 501 for a transfer coding other than chunked are the protocol's
answers, as nginx gives them, not failures), (2) stay alive, and
(3) never let the upstream see a request it did not see whole: every request the
upstream reads must be one the test sent, with the method, target and body it was
sent with, and bytes placed inside a body must never surface as a request (request
smuggling), and (4) answer every request of a valid pipeline, in order, whatever its
methods and bodies. The upstream is a bare socket server that accepts any method and reads
Content-Length and chunked bodies itself, so it sees exactly what the gateway sent.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.http.routing import BadURI, normalize_uri
from gateway.proxy.rewrite import escape_uri
from tests.support.config import basic_config
from tests.support.upstreams import HeadEchoUpstream

SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: a\r\nX-Fuzz-Id: smuggled\r\n\r\n"


@dataclass(frozen=True)
class Sent:
    ident: str
    method: str
    target: str
    body: bytes
    raw: bytes


token = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ-_", min_size=1, max_size=12)
methods = st.one_of(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]), token)
path_chars = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-._~/?=&+", max_size=40)
header_names = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-", min_size=1, max_size=20
)
header_values = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60)
bodies = st.one_of(st.just(b""), st.binary(max_size=300), st.just(SMUGGLED), st.just(b"0\r\n\r\n" + SMUGGLED))


@st.composite
def requests(draw: st.DrawFn, ident: str, last: bool) -> Sent:
    method = draw(methods)
    target = "/" + draw(path_chars)
    body = draw(bodies)
    framing = draw(st.sampled_from(["length", "chunked", "none"] if body else ["none", "length"]))
    headers = [(draw(header_names), draw(header_values)) for _ in range(draw(st.integers(0, 4)))]
    # (framing and Host are the test's own; Connection and Expect would change which requests are answered)
    reserved = ("content-length", "transfer-encoding", "host", "connection", "expect")
    headers = [(n, v) for n, v in headers if n.lower() not in reserved]
    lines = [f"{method} {target} HTTP/1.1", "Host: fuzz", f"X-Fuzz-Id: {ident}"]
    if last:
        lines.append("Connection: close")
    lines += [f"{n}: {v}" for n, v in headers]
    if framing == "length":
        lines.append(f"Content-Length: {len(body)}")
        payload = body
    elif framing == "chunked":
        lines.append("Transfer-Encoding: chunked")
        payload = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    else:
        payload = b""
        body = b""
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode() + payload
    return Sent(ident, method, target, body, raw)


@st.composite
def mutated(draw: st.DrawFn, raw: bytes) -> bytes:
    data = bytearray(raw)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "insert", "delete", "dup-line", "crlf"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[at] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[at:at] = draw(
                st.sampled_from([b"\r\n", b"\n", b" ", b"\x00", b":", b"\r", b"Transfer-Encoding: chunked\r\n"])
            )
        elif kind == "delete" and data:
            del data[at : at + draw(st.integers(1, 5))]
        elif kind == "dup-line":
            end = data.find(b"\r\n", at)
            start = data.rfind(b"\r\n", 0, at)
            if 0 <= start < end:
                data[end:end] = data[start:end]
        else:
            data[at:at] = b"\r\n"
    return bytes(data)


def talk(port: int, data: bytes, timeout: float = 1.0) -> bytes:
    """Send, then read until the gateway closes (a complete last request says Connection: close)
    or ``timeout`` passes with nothing (it waits for the rest of an incomplete request)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(timeout)
        with contextlib.suppress(OSError):
            sock.sendall(data)
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return out


def routed_target(target: str) -> str:
    """What the upstream gets for ``target``: its path normalised when it is not already
    (test_request_targets.py checks that rule against nginx); "" for a target refused with 400."""
    path, mark, query = target.partition("?")
    try:
        uri = normalize_uri(path)
    except BadURI:
        return ""
    return target if uri == path else escape_uri(uri) + mark + query


def statuses(response: bytes) -> list[int]:
    """Every status line in what came back (a status line may follow a body without a line break)."""
    return [int(code) for code in re.findall(rb"HTTP/1\.[01] (\d{3}) ", response)]


@pytest.fixture(scope="module")
def fuzz_target(tmp_path_factory) -> Iterator[tuple[int, HeadEchoUpstream, object]]:
    from tests.support.gateway import Gateway
    from tests.support.ports import free_port

    upstream = HeadEchoUpstream().start()
    port = free_port()
    text = (
        basic_config(port, [upstream.address])
        + "client_header_timeout: 2s\nlog: {access: off}\ndefaults: {client_body_timeout: 1s}\n"
    )
    gw = Gateway(tmp_path_factory.mktemp("fuzz"), text, port).start()
    yield port, upstream, gw
    gw.stop()
    upstream.stop()


_counter = iter(range(10**9))


@settings(
    max_examples=100,
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_fuzzed_requests_never_crash_desync_or_5xx(fuzz_target, data):
    port, upstream, gw = fuzz_target
    count = data.draw(st.integers(1, 3))
    # a fixed width: the requests, and so what the mutations draw from, keep one length for
    # the same choices (hypothesis replays choices and checks their bounds match)
    batch = [data.draw(requests(f"id{next(_counter):09d}", i == count - 1)) for i in range(count)]
    wire = b"".join(s.raw for s in batch)
    valid = not data.draw(st.booleans())
    if not valid:
        wire = data.draw(mutated(wire))
    before = len(upstream.heads)
    # a valid pipeline ends with Connection: close, so the gateway closes when it is done: wait for that
    response = talk(port, wire, timeout=10.0 if valid else 1.0)
    if os.environ.get("FUZZ_STATS"):
        with open(os.environ["FUZZ_STATS"], "a") as fh:
            fh.write(f"{statuses(response)} {len(upstream.heads) - before}\n")
    for status in statuses(response):
        assert status < 500 or status in (501, 505), (status, wire[:300], response[:300])
    assert gw.proc.poll() is None, "the gateway died"
    sent = {s.ident: s for s in batch}
    for head in upstream.heads[before:]:
        ids = [v for k, v in head["headers"] if k.lower() == "x-fuzz-id"]
        assert "smuggled" not in ids and not head["target"].startswith("/smuggled"), ("smuggled", wire[:300])
        if wire != b"".join(s.raw for s in batch):
            continue  # a mutated request may legitimately parse as something else; it must not smuggle
        assert len(ids) == 1 and ids[0] in sent, head
        want = sent[ids[0]]
        assert (head["method"], head["target"], head["body_bytes"].encode("latin-1")) == (
            want.method,
            routed_target(want.target),
            want.body,
        )
    if valid and all(routed_target(s.target) for s in batch):
        # A valid pipeline, bodies and custom methods included, is answered whole and in order.
        assert statuses(response) == [200] * count, (wire[:300], response[-300:])
        seen = [next(v for k, v in head["headers"] if k.lower() == "x-fuzz-id") for head in upstream.heads[before:]]
        assert seen == [s.ident for s in batch], wire[:300]


def test_the_gateway_still_serves_after_the_fuzzing(fuzz_target):
    port, _, gw = fuzz_target
    response = talk(port, b"GET /after HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert statuses(response) == [200]
    assert "Traceback" not in gw.stderr()
