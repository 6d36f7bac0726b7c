"""TLS termination and TLS upstreams, end to end: the gateway started through its CLI, real
TLS clients (Python's ssl, and curl when installed), certificates made at run time."""

from __future__ import annotations

import contextlib
import http.client
import json
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.certs import Issued, TestCA, names_of
from tests.support.gateway import Gateway, cli
from tests.support.ports import free_port, wait_port
from tests.support.upstreams import Upstream


def client_context(ca: Path | None) -> ssl.SSLContext:
    if ca is None:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    return ssl.create_default_context(cafile=str(ca))


class TlsClient:
    """One TLS connection (keep-alive), with the SNI name ``sni`` (None: no SNI)."""

    def __init__(self, port: int, sni: str | None, ca: Path | None) -> None:
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        context = client_context(ca)
        try:
            self.sock = context.wrap_socket(raw, server_hostname=sni)
        except BaseException:
            raw.close()
            raise
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        self.conn.sock = self.sock
        self.host = sni or "127.0.0.1"

    @property
    def names(self) -> list[str]:
        der = self.sock.getpeercert(binary_form=True)
        assert der is not None
        return names_of(der)

    def get(self, path: str = "/", host: str | None = None) -> tuple[int, bytes]:
        self.conn.request("GET", path, headers={"Host": host or self.host})
        response = self.conn.getresponse()
        return response.status, response.read()

    def close(self) -> None:
        self.conn.close()


def served_names(port: int, sni: str | None, ca: Path | None) -> list[str]:
    client = TlsClient(port, sni, ca)
    try:
        return client.names
    finally:
        client.close()


@pytest.fixture
def ca(tmp_path: Path) -> TestCA:
    return TestCA(tmp_path / "pki")


def tls_config(port: int, plain_port: int, upstream: Upstream, cert: Issued, extra: str = "") -> str:
    return f"""
listen:
  - 127.0.0.1:{plain_port}
  - {{address: "127.0.0.1:{port}", ssl: true}}
ssl_certificate: {cert.cert}
ssl_certificate_key: {cert.key}
client_header_timeout: 1s
shutdown_timeout: 2s
admin: {{listen: off}}
log:
  format: '$scheme https=$https $ssl_protocol $ssl_cipher $status'
{extra}
upstreams:
  app:
    servers: [{upstream.address}]
routes:
  - location: /
    upstream: app
    add_header:
      - {{name: X-Scheme, value: $scheme, always: true}}
      - {{name: X-Tls, value: $ssl_protocol, always: true}}
"""


@pytest.fixture
def start_tls(tmp_path: Path, upstream: Upstream) -> Iterator[Callable[..., tuple[Gateway, int]]]:
    started: list[Gateway] = []

    def start(cert: Issued, extra: str = "", config: Callable[[int, int], str] | None = None) -> tuple[Gateway, int]:
        port, plain = free_port(), free_port()
        workdir = tmp_path / f"gw{len(started)}"
        workdir.mkdir()
        text = config(port, plain) if config else tls_config(port, plain, upstream, cert, extra)
        gw = Gateway(workdir, text, plain)
        started.append(gw)
        gw.start()
        wait_port(port, proc=gw.proc)  # the TLS socket opens after the plain one
        return gw, port

    yield start
    for gw in started:
        gw.stop()


# -- serving HTTPS ---------------------------------------------------------------------------------


def test_https_listener_scheme_headers_and_variables(
    ca: TestCA, upstream: Upstream, start_tls: Callable[..., tuple[Gateway, int]]
) -> None:
    cert = ca.issue("site", "site.test")
    gw, port = start_tls(cert)
    client = TlsClient(port, "site.test", ca.bundle)
    client.conn.request("GET", "/hello", headers={"Host": "site.test"})
    response = client.conn.getresponse()
    body = json.loads(response.read())
    assert response.status == 200
    assert response.getheader("X-Scheme") == "https"
    assert response.getheader("X-Tls") in ("TLSv1.2", "TLSv1.3")
    headers = {k.lower(): v for k, v in body["headers"]}
    assert headers["x-forwarded-proto"] == "https"
    version, cipher_used = client.sock.version(), client.sock.cipher()
    client.close()
    # the plain listener of the same gateway stays http
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=5)
    conn.request("GET", "/plain")
    plain = conn.getresponse()
    plain_body = json.loads(plain.read())
    assert plain.getheader("X-Scheme") == "http"
    assert {k.lower(): v for k, v in plain_body["headers"]}["x-forwarded-proto"] == "http"
    conn.close()
    lines = gw.access_lines()
    tls_line = next(line for line in lines if line.startswith("https "))
    _, https, protocol, cipher, status = tls_line.split()
    assert (https, status) == ("https=on", "200")
    assert protocol == response.getheader("X-Tls") == version
    assert cipher_used is not None and cipher == cipher_used[0]
    assert "http https=- - - 200" in lines  # empty variables log as "-", as in nginx


def test_sni_chooses_the_certificate_with_wildcards_and_a_default(
    ca: TestCA, start_tls: Callable[..., tuple[Gateway, int]]
) -> None:
    default = ca.issue("default", "default.test")
    a = ca.issue("a", "a.test")
    b = ca.issue("b", "*.b.test")
    _, port = start_tls(
        default,
        extra=f"""
ssl_certificates:
  - {{server_name: a.test, certificate: {a.cert}, key: {a.key}}}
  - {{server_name: "*.b.test", certificate: {b.cert}, key: {b.key}}}
""",
    )
    assert served_names(port, "a.test", ca.bundle) == ["a.test"]
    assert served_names(port, "x.b.test", ca.bundle) == ["*.b.test"]
    # nginx's *.name matches at any depth (the client's own check then refuses a two-label match)
    assert served_names(port, "deep.x.b.test", None) == ["*.b.test"]
    assert served_names(port, "default.test", ca.bundle) == ["default.test"]
    with pytest.raises(ssl.SSLCertVerificationError):  # an unknown name gets the default certificate
        served_names(port, "other.test", ca.bundle)
    client = TlsClient(port, None, None)  # no SNI at all
    assert client.names == ["default.test"]
    assert client.get()[0] == 200
    client.close()


def test_server_blocks_bring_their_own_certificates(
    ca: TestCA, upstream: Upstream, start_tls: Callable[..., tuple[Gateway, int]]
) -> None:
    one = ca.issue("one", "one.test")
    two = ca.issue("two", "two.test")

    def config(port: int, plain: int) -> str:
        return f"""
listen: 127.0.0.1:{plain}
admin: {{listen: off}}
upstreams:
  app:
    servers: [{upstream.address}]
ssl_certificate: {one.cert}
ssl_certificate_key: {one.key}
servers:
  - server_name: one.test
    listen: [127.0.0.1:{plain}, "127.0.0.1:{port} ssl"]
    routes: [{{location: /, return: {{code: 200, text: "one $scheme"}}}}]
  - server_name: two.test
    listen: ["127.0.0.1:{port} ssl"]
    ssl_certificate: {two.cert}
    ssl_certificate_key: {two.key}
    routes: [{{location: /, return: {{code: 200, text: "two $scheme"}}}}]
"""

    _, port = start_tls(one, config=config)
    assert served_names(port, "one.test", ca.bundle) == ["one.test"]
    client = TlsClient(port, "two.test", ca.bundle)
    assert client.names == ["two.test"]
    assert client.get() == (200, b"two https")
    client.close()


def test_curl_over_tls(ca: TestCA, start_tls: Callable[..., tuple[Gateway, int]]) -> None:
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("no curl")
    cert = ca.issue("site", "site.test")
    _, port = start_tls(cert)
    out = subprocess.run(
        [curl, "-sS", "--cacert", str(ca.bundle), "--resolve", f"site.test:{port}:127.0.0.1",
         "-o", "/dev/null", "-D", "-", f"https://site.test:{port}/x"],
        capture_output=True, text=True, timeout=20,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "x-scheme: https" in out.stdout.lower()


# -- reload ----------------------------------------------------------------------------------------


def _wait_for(gw: Gateway, text: str, count: int = 1, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while gw.stderr().count(text) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"no {text!r} in:\n{gw.stderr()}")
        time.sleep(0.05)


def test_reload_new_certificate_keeps_connections_and_bad_one_is_refused(
    ca: TestCA, start_tls: Callable[..., tuple[Gateway, int]]
) -> None:
    first = ca.issue("site", "site.test", "first.test")
    gw, port = start_tls(first)
    before = TlsClient(port, "site.test", ca.bundle)
    assert before.get()[0] == 200
    assert before.names == ["site.test", "first.test"]

    ca.issue("site", "site.test", "second.test")  # new files at the same paths
    gw.reload(settle=0)
    _wait_for(gw, "configuration reloaded")
    assert before.get()[0] == 200  # the connection made before the reload serves on (keep-alive)
    assert before.get()[0] == 200
    assert served_names(port, "site.test", ca.bundle) == ["site.test", "second.test"]

    other = ca.issue("other", "site.test")
    first_key = first.key.read_bytes()
    first.key.write_bytes(other.key.read_bytes())  # a key that is not the certificate's
    gw.reload(settle=0)
    _wait_for(gw, "reload failed")
    assert "does not match the certificate" in gw.stderr()
    assert served_names(port, "site.test", ca.bundle) == ["site.test", "second.test"]
    assert before.get()[0] == 200
    before.close()
    first.key.write_bytes(first_key)
    assert "Traceback" not in gw.stderr()


# -- hostile and confused clients ------------------------------------------------------------------


@pytest.mark.timing
def test_plain_http_to_tls_port_and_silent_clients_are_closed_quietly(
    ca: TestCA, start_tls: Callable[..., tuple[Gateway, int]]
) -> None:
    cert = ca.issue("site", "site.test")
    gw, port = start_tls(cert)  # client_header_timeout: 1s bounds the handshake
    plain = socket.create_connection(("127.0.0.1", port), timeout=5)
    plain.sendall(b"GET / HTTP/1.1\r\nHost: site.test\r\n\r\n")
    answer = b""
    while chunk := plain.recv(4096):
        answer += chunk
    plain.close()
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer  # as nginx answers it
    assert b"The plain HTTP request was sent to HTTPS port" in answer

    garbage = socket.create_connection(("127.0.0.1", port), timeout=5)
    garbage.sendall(b"\x16\x03\x01\x00\x05hello")  # a TLS record that is no ClientHello
    with contextlib.suppress(ConnectionResetError):
        assert garbage.recv(4096)[:1] in (b"", b"\x15")  # closed, or a TLS alert
    garbage.close()

    silent = socket.create_connection(("127.0.0.1", port), timeout=10)
    started = time.monotonic()
    try:
        closed = silent.recv(1) == b""
    except ConnectionResetError:
        closed = True
    waited = time.monotonic() - started
    silent.close()
    assert closed and 0.5 < waited < 5, waited

    assert served_names(port, "site.test", ca.bundle) == ["site.test"]  # still serving
    time.sleep(0.3)
    assert "Traceback" not in gw.stderr()
    assert "[error]" not in gw.stderr() and "[crit]" not in gw.stderr(), gw.stderr()


# -- configuration errors --------------------------------------------------------------------------


def _check(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    conf = tmp_path / "check.yaml"
    conf.write_text(text)
    return cli("check", "-c", str(conf))


def _base(extra: str) -> str:
    return f"""listen:
  - {{address: "127.0.0.1:8443", ssl: true}}
{extra}
routes:
  - location: /
    return: {{code: 200, text: ok}}
"""


def test_check_reports_certificate_problems_with_file_line_and_key(ca: TestCA, tmp_path: Path) -> None:
    good = ca.issue("good", "good.test")
    other = ca.issue("other", "other.test")
    expired = ca.issue("expired", "old.test", expired=True)
    conf = tmp_path / "check.yaml"

    missing = _check(tmp_path, _base(f"ssl_certificate: {tmp_path}/nope.crt\nssl_certificate_key: {good.key}"))
    assert missing.returncode != 0
    assert f"{conf}:3:" in missing.stderr and "ssl_certificate: cannot read the certificate file" in missing.stderr
    assert "No such file" in missing.stderr

    mismatch = _check(tmp_path, _base(f"ssl_certificate: {good.cert}\nssl_certificate_key: {other.key}"))
    assert mismatch.returncode != 0
    assert f"{conf}:4:" in mismatch.stderr and "ssl_certificate_key: the key in" in mismatch.stderr
    assert "does not match the certificate" in mismatch.stderr

    not_pem = _check(tmp_path, _base(f"ssl_certificate: {ca.bundle}\nssl_certificate_key: {ca.bundle}"))
    assert "is not a PEM key" in not_pem.stderr and not_pem.returncode != 0

    no_cert = _check(tmp_path, _base(""))
    assert no_cert.returncode != 0
    assert f"{conf}:2:" in no_cert.stderr and "a listen with ssl needs ssl_certificate" in no_cert.stderr

    sslv3 = _check(
        tmp_path, _base(f"ssl_certificate: {good.cert}\nssl_certificate_key: {good.key}\nssl_protocols: SSLv3 TLSv1.2")
    )
    assert "ssl_protocols: SSLv3 is not supported" in sslv3.stderr and sslv3.returncode != 0

    gap = _check(
        tmp_path,
        _base(f"ssl_certificate: {good.cert}\nssl_certificate_key: {good.key}\nssl_protocols: [TLSv1, TLSv1.3]"),
    )
    assert "contiguous" in gap.stderr and gap.returncode != 0

    old = _check(tmp_path, _base(f"ssl_certificate: {expired.cert}\nssl_certificate_key: {expired.key}"))
    assert old.returncode == 0, old.stderr
    assert (
        "warning:" in old.stderr and "ssl_certificate: the certificate in" in old.stderr and "expired on" in old.stderr
    )

    sni_missing = _check(
        tmp_path,
        _base(
            f"ssl_certificate: {good.cert}\nssl_certificate_key: {good.key}\nssl_certificates:\n"
            f"  - {{server_name: a.test, certificate: {good.cert}, key: {tmp_path}/gone.key}}"
        ),
    )
    assert "ssl_certificates[0].key: cannot read the key file" in sni_missing.stderr

    half = _check(tmp_path, _base(f"ssl_certificate: {good.cert}"))
    assert f"{conf}:3:" in half.stderr and "ssl_certificate: ssl_certificate_key is required" in half.stderr

    ok = _check(
        tmp_path, _base(f"ssl_certificate: {good.cert}\nssl_certificate_key: {good.key}\nssl_protocols: TLSv1.3")
    )
    assert ok.returncode == 0 and ok.stdout.strip() == "ok", ok.stderr


# -- TLS upstreams ---------------------------------------------------------------------------------


@pytest.fixture
def tls_upstream(ca: TestCA) -> Iterator[Upstream]:
    cert = ca.issue("backend", "backend.internal")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert.cert, cert.key)
    up = Upstream("tls-up", ssl_context=context).start()
    yield up
    up.stop()


def test_upstream_tls_with_private_ca_and_server_name(
    ca: TestCA, tls_upstream: Upstream, gateway_factory: Callable[..., Gateway]
) -> None:
    def config(port: int) -> str:
        return f"""
listen: 127.0.0.1:{port}
upstreams:
  named:
    servers: [{tls_upstream.address}]
    scheme: https
    tls_ca: {ca.bundle}
    tls_server_name: backend.internal
  by_address:
    servers: [{tls_upstream.address}]
    scheme: https
    tls_ca: {ca.bundle}
  system_ca:
    servers: [{tls_upstream.address}]
    scheme: https
    tls_server_name: backend.internal
routes:
  - {{location: /named, upstream: named}}
  - {{location: /by_address, upstream: by_address}}
  - {{location: /system_ca, upstream: system_ca}}
"""

    gw = gateway_factory(config)
    ok = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    ok.request("GET", "/named")
    response = ok.getresponse()
    assert response.status == 200
    assert json.loads(response.read())["server"] == "tls-up"
    ok.close()
    for path in ("/by_address", "/system_ca"):  # 127.0.0.1 is not in the certificate; the CA is private
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
        conn.request("GET", path)
        assert conn.getresponse().status == 502, path
        conn.close()
    assert "certificate verify failed" in gw.stderr()


def test_upstream_tls_options_are_checked(ca: TestCA, tmp_path: Path) -> None:
    text = f"""upstreams:
  app:
    servers: [127.0.0.1:9000]
    scheme: https
    tls_ca: {tmp_path}/nope.pem
  plain:
    servers: [127.0.0.1:9000]
    tls_server_name: backend.internal
routes:
  - location: /
    upstream: app
"""
    out = _check(tmp_path, text)
    assert out.returncode != 0
    assert "upstreams.app.tls_ca: cannot read the CA bundle" in out.stderr
    assert "upstreams.plain.tls_server_name: tls_server_name applies to scheme: https only" in out.stderr


# -- the listen forms and the certificate table, without a process ----------------------------------


def test_listen_forms_and_the_sni_table(ca: TestCA) -> None:
    from gateway.config.servers import ListenSpec
    from gateway.errors import ConfigErrors
    from gateway.plan import load_config_text

    default = ca.issue("default", "default.test")
    api = ca.issue("api", "*.api.test")
    config = load_config_text(f"""
listen:
  - 127.0.0.1:8080
  - "127.0.0.1:8443 ssl"
  - {{address: "[::1]:9443", ssl: true}}
  - {{address: 127.0.0.1:9080, ssl: false}}
ssl_certificate: {default.cert}
ssl_certificate_key: {default.key}
ssl_protocols: [TLSv1.3]
ssl_certificates:
  - {{server_name: ["*.api.test", api.test], certificate: {api.cert}, key: {api.key}}}
routes:
  - location: /
    return: {{code: 204}}
""")
    assert config.spec.listen == (
        ListenSpec("127.0.0.1", 8080),
        ListenSpec("127.0.0.1", 8443, True),
        ListenSpec("::1", 9443, True),
        ListenSpec("127.0.0.1", 9080),
    )
    assert set(config.tls) == {("127.0.0.1", 8443), ("::1", 9443)}
    table = config.tls[("127.0.0.1", 8443)]
    assert table.spec.protocols == ("TLSv1.3",)
    assert table.context_for(None) is table.default
    assert table.context_for("v1.API.test") is table.context_for("api.test") is not table.default
    assert table.context_for("unknown.test") is table.default
    for bad, message in [
        ('listen: "127.0.0.1:8443 tls"', "unknown or repeated listen parameter 'tls'"),
        ("listen: [{address: 127.0.0.1:8443, ssl: yes please}]", "expected true or false"),
        ("listen: [{ssl: true}]", "missing required key 'address'"),
        ("listen: [127.0.0.1:8443, '127.0.0.1:8443 ssl']", "duplicate listen 127.0.0.1:8443"),
        ("listen: 8080\nssl_ciphers: NOT-A-CIPHER", "OpenSSL knows no cipher"),
    ]:
        with pytest.raises(ConfigErrors, match=message):
            load_config_text(bad + "\nroutes: [{location: /, return: {code: 204}}]\n")


@pytest.mark.timing
def test_a_client_hello_in_pieces_and_a_stalled_one(ca: TestCA, start_tls: Callable[..., tuple[Gateway, int]]) -> None:
    """The first bytes read to tell TLS from plain HTTP reach the handshake, whatever follows
    them and however late; a ClientHello that stops halfway is closed at client_header_timeout."""
    cert = ca.issue("site", "site.test")
    gw, port = start_tls(cert)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = client_context(ca.bundle).wrap_bio(incoming, outgoing, server_hostname="site.test")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    for piece in (hello[:3], hello[3:60], hello[60:]):  # three packets, 0.2 s apart
        sock.sendall(piece)
        time.sleep(0.2)
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            if outgoing.pending:
                sock.sendall(outgoing.read())
            incoming.write(sock.recv(65536))
    tls.write(b"GET /pieces HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\n\r\n")
    sock.sendall(outgoing.read())
    answer = b""
    while b"\r\n\r\n" not in answer:
        try:
            answer += tls.read(65536)
        except ssl.SSLWantReadError:
            if outgoing.pending:
                sock.sendall(outgoing.read())
            incoming.write(sock.recv(65536))
    sock.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer

    stalled = socket.create_connection(("127.0.0.1", port), timeout=10)
    stalled.sendall(hello[:40])
    started = time.monotonic()
    try:
        closed = stalled.recv(1) in (b"", b"\x15")
    except ConnectionResetError:
        closed = True
    stalled.close()
    assert closed and time.monotonic() - started < 5
    time.sleep(0.3)
    assert "Traceback" not in gw.stderr() and "[error]" not in gw.stderr(), gw.stderr()
