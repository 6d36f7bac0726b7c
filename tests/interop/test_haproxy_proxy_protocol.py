"""HAProxy in front of the gateway (mode tcp), sending the PROXY protocol v1 (``send-proxy``) and
v2 (``send-proxy-v2``), to a plain and to a TLS listener with ``proxy_protocol``.

The client connects to HAProxy from 127.0.0.2; HAProxy connects to the gateway from 127.0.0.1,
which ``real_ip.from`` trusts, so ``$remote_addr`` must be 127.0.0.2. HAProxy's health checks
(``check-send-proxy``: a v2 check is a LOCAL header) must not be taken for broken headers.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.certs import TestCA
from tests.support.ports import free_port, wait_port

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
pytestmark = pytest.mark.skipif(not Path(HAPROXY).exists(), reason="haproxy is not installed (Debian package haproxy)")

CLIENT = "127.0.0.2"


def haproxy_config(fronts: dict[str, tuple[int, int, str]]) -> str:
    """``name -> (haproxy port, gateway port, server options)``."""
    lines = [
        "global",
        "  maxconn 100",
        "defaults",
        "  mode tcp",
        "  timeout connect 2s",
        "  timeout client 10s",
        "  timeout server 10s",
    ]
    for name, (front, back, options) in fronts.items():
        lines += [
            f"frontend fe_{name}",
            f"  bind 127.0.0.1:{front}",
            f"  default_backend be_{name}",
            f"backend be_{name}",
            f"  server gw 127.0.0.1:{back} {options} check check-send-proxy inter 300ms",
        ]
    return "\n".join(lines) + "\n"


@pytest.fixture
def haproxy(tmp_path: Path) -> Iterator[Callable[[dict[str, tuple[int, int, str]]], None]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(fronts: dict[str, tuple[int, int, str]]) -> None:
        path = tmp_path / "haproxy.cfg"
        path.write_text(haproxy_config(fronts))
        check = subprocess.run([HAPROXY, "-c", "-f", str(path)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        with (tmp_path / "haproxy.log").open("wb") as log:
            proc = subprocess.Popen([HAPROXY, "-db", "-f", str(path)], stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        for front, _, _ in fronts.values():
            wait_port(front, timeout=10, proc=proc)

    yield start
    for proc in procs:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def fetch(port: int, context: ssl.SSLContext | None = None) -> str:
    """One request through HAProxy, from 127.0.0.2; the answer's body."""
    sock = socket.socket()
    sock.settimeout(5)
    sock.bind((CLIENT, 0))
    sock.connect(("127.0.0.1", port))
    with contextlib.closing(context.wrap_socket(sock, server_hostname="localhost") if context else sock) as conn:
        conn.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        out = b""
        while data := conn.recv(65536):
            out += data
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), out
    return body.decode()


def gateway_yaml(plain: int, tls: int, cert: Path, key: Path) -> str:
    return f"""
listen:
  - "127.0.0.1:{plain} proxy_protocol"
  - {{address: "127.0.0.1:{tls}", ssl: true, proxy_protocol: true}}
ssl_certificate: {cert}
ssl_certificate_key: {key}
admin: {{listen: "off"}}
real_ip: {{from: [127.0.0.1/32], header: proxy_protocol}}
routes:
  - location: /
    return: {{code: 200, text: "ra=$remote_addr ppa=$proxy_protocol_addr scheme=$scheme"}}
"""


def test_haproxy_send_proxy_v1_and_v2(gateway_factory, haproxy, tmp_path: Path) -> None:
    ca = TestCA(tmp_path / "ca")
    issued = ca.issue("gw", "localhost")
    tls_port = free_port()
    gw = gateway_factory(lambda port: gateway_yaml(port, tls_port, issued.cert, issued.key))
    wait_port(tls_port, timeout=10)
    fronts = {
        "v1": (free_port(), gw.port, "send-proxy"),
        "v2": (free_port(), gw.port, "send-proxy-v2"),
        "tls_v1": (free_port(), tls_port, "send-proxy"),
        "tls_v2": (free_port(), tls_port, "send-proxy-v2"),
    }
    haproxy(fronts)
    context = ssl.create_default_context(cafile=str(ca.bundle))
    for name, (front, _, _) in fronts.items():
        tls = name.startswith("tls")
        for _ in range(3):
            body = fetch(front, context if tls else None)
            assert body == f"ra={CLIENT} ppa={CLIENT} scheme={'https' if tls else 'http'}", name
    time.sleep(1.0)  # a few rounds of health checks (check-send-proxy: v1 lines, v2 LOCAL headers)
    assert "broken header" not in gw.stderr(), gw.stderr()
