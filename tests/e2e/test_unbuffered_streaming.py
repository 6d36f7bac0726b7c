"""With ``proxy_buffering: off`` (or ``X-Accel-Buffering: no``), every byte goes to the client as it arrives.

An upstream on a real socket sends its status line and headers, then one body byte every
150 ms, like httpbin's ``/drip``; the client reads the gateway's answer from a raw socket
and records when each byte came. Before, a response with a ``Content-Length`` of up to
256 KiB was read whole first, so nothing, not even the status line, reached the client
until the upstream had finished (3.0 s through the gateway, 0.004 s through nginx).
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from tests.support.config import config
from tests.support.ports import free_port

DRIP = 8
STEP = 0.15


class DripUpstream:
    """Answers every request with its head at once, then the body one byte every ``STEP``."""

    def __init__(self, framing: str, accel: bool) -> None:
        self.framing = framing
        self.accel = accel
        self.port = free_port()
        self.sock = socket.create_server(("127.0.0.1", self.port))
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.answer, args=(conn,), daemon=True).start()

    def answer(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
            if self.accel:
                head += b"X-Accel-Buffering: no\r\n"
            if self.framing == "length":
                head += b"Content-Length: %d\r\n" % DRIP
            elif self.framing == "chunked":
                head += b"Transfer-Encoding: chunked\r\n"
            else:
                head += b"Connection: close\r\n"
            conn.sendall(head + b"\r\n")
            for _ in range(DRIP):
                time.sleep(STEP)
                conn.sendall(b"1\r\n*\r\n" if self.framing == "chunked" else b"*")
            if self.framing == "chunked":
                conn.sendall(b"0\r\n\r\n")

    def close(self) -> None:
        self.sock.close()


def byte_times(port: int) -> tuple[float, list[float]]:
    """When the status line came, and when each body byte did (seconds from the request)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /drip HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        data = b""
        status_at = None
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, data
            status_at = status_at if status_at is not None else time.monotonic() - started
            data += chunk
        header, body = data.split(b"\r\n\r\n", 1)
        assert header.startswith(b"HTTP/1.1 200")
        chunked = b"transfer-encoding: chunked" in header.lower()
        times: list[float] = []
        stars = body.count(b"*")
        times += [time.monotonic() - started] * stars
        while len(times) < DRIP:
            chunk = sock.recv(1)
            assert chunk, f"closed after {len(times)} bytes"
            if chunk == b"*":
                times.append(time.monotonic() - started)
        if chunked:
            pass  # the terminating chunk follows; not timed
        assert status_at is not None
        return status_at, times


@pytest.mark.parametrize(
    "setting, framing, accel",
    [
        ("proxy_buffering: off", "length", False),
        ("proxy_buffering: off", "chunked", False),
        ("proxy_buffering: off", "close", False),
        ("proxy_buffering: on", "length", True),  # X-Accel-Buffering: no
        ("proxy_buffering: on", "chunked", True),
    ],
)
def test_each_byte_reaches_the_client_as_the_upstream_sends_it(gateway_factory, setting, framing, accel):
    upstream = DripUpstream(framing, accel)
    try:
        gw = gateway_factory(config(upstream, route=f"    {setting}", admin='{listen: "off"}'))
        status_at, times = byte_times(gw.port)
    finally:
        upstream.close()
    whole = DRIP * STEP
    # The status line comes before the first byte is even sent, and the bytes come one by
    # one: by the time half were sent upstream, the client has at least some of them. A
    # buffered relay would show everything at once at about `whole` seconds.
    assert status_at < STEP + 0.1 or status_at < times[0], (status_at, times)
    assert times[0] < whole * 0.75, times
    assert times[-1] - times[0] >= (DRIP - 1) * STEP * 0.5, times


def test_a_buffered_small_response_is_still_written_at_once(gateway_factory):
    """proxy_buffering on without X-Accel-Buffering: nginx's default, kept (one write)."""
    upstream = DripUpstream("length", accel=False)
    try:
        gw = gateway_factory(config(upstream, route="    proxy_buffering: on", admin='{listen: "off"}'))
        status_at, times = byte_times(gw.port)
    finally:
        upstream.close()
    assert status_at >= (DRIP - 1) * STEP * 0.9
    assert times[-1] - times[0] < 0.05
