"""TLS probes leave no asyncio warning in the error log.

A scanner (testssl.sh, a load balancer's TLS check) completes a handshake and closes at
once. The close reached the protocol that holds a connection during its handshake, which
answered ``eof_received`` with True, and asyncio logged "returning true from
eof_received() has no effect when using ssl" for each probe (35 lines for one testssl run).
"""

from __future__ import annotations

import socket
import ssl
import time

from tests.support.certs import TestCA


def test_handshake_then_close_logs_nothing(gateway_factory, tmp_path):
    ca = TestCA(tmp_path / "pki")
    cert = ca.issue("gw", "localhost")
    gw = gateway_factory(
        lambda port: (
            f"""
listen: 127.0.0.1:{port} ssl
ssl_certificate: {cert.cert}
ssl_certificate_key: {cert.key}
upstreams:
  app: {{servers: [127.0.0.1:9]}}
routes:
  - location: /
    return: {{code: 200, text: ok}}
"""
        )
    )
    context = ssl.create_default_context(cafile=str(ca.directory / "ca.pem"))
    for i in range(40):
        with (
            socket.create_connection(("127.0.0.1", gw.port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            if i % 2:
                tls.unwrap().close()  # close_notify, then the TCP close
    with (
        socket.create_connection(("127.0.0.1", gw.port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):  # still serving
        tls.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        assert tls.recv(100).startswith(b"HTTP/1.1 200")
    time.sleep(0.3)
    log = gw.stderr()
    assert "eof_received" not in log and "Traceback" not in log, log[-3000:]
