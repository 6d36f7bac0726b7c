"""Distributed floods leave room for normal clients (issue 23, items 2, 3 and 4).

The gateway runs through its CLI under ``prlimit --nofile=1024`` and ``--nofile=4096`` (the
limits containers often have), below its default ``worker_connections`` of 10,240. An attacker
process holds as many connections as it can and opens a new one for every one the gateway
closes, from many loopback addresses (all of 127.0.0.0/8 is local on Linux):

* 6,000 half-header senders (a slowloris from 6,000 addresses);
* slow request bodies from 45 addresses, up to the per-address cap of 256 connections each
  (11,520: more than any budget here), each a byte every few seconds after its header;
* TLS handshakes that stop halfway through the ClientHello, from one address and from 6,000.

Meanwhile a normal client (127.0.0.1) sends one request at a time on a new connection each, to
the plain-HTTP port. Every one must be answered, at a median under 100 ms.
"""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import os
import resource
import select
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.certs import TestCA
from tests.support.config import basic_config
from tests.support.gateway import Gateway
from tests.support.paths import ROOT
from tests.support.ports import free_port, wait_port
from tests.support.upstreams import HeadEchoUpstream

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)"),
]

PROBE_SECONDS = 8.0
RAMP_SECONDS = 4.0  # the attacker's connections are open (and refilled) before probing starts
REFILL_PER_SECOND = 1000  # the attacker's new connections per second, at most


# -- the gateway under an open file limit ----------------------------------------------------------


class LimitedGateway(Gateway):
    """The gateway's CLI run as ``prlimit --nofile=N gateway run``."""

    def __init__(self, workdir: Path, config_text: str, port: int, nofile: int) -> None:
        super().__init__(workdir, config_text, port)
        self.nofile = nofile

    def start(self, timeout: float = 15.0) -> LimitedGateway:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        command = ["prlimit", f"--nofile={self.nofile}", "--", sys.executable, "-m", "gateway", "run"]
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [*command, "-c", str(self.config_path)], stdout=out, stderr=err, cwd=str(ROOT), env=env
            )
        try:
            wait_port(self.port, timeout=timeout, proc=self.proc)
        except Exception:
            self.stop()
            raise RuntimeError(f"gateway did not start:\n{self.stderr()}") from None
        return self


@pytest.fixture(autouse=True)
def many_files() -> Iterator[None]:
    """The attacker and the test hold thousands of sockets: the test's own limit goes up."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 16_000:
        pytest.skip(f"the test process needs 16,000 open files (hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture
def raw_upstream() -> Iterator[HeadEchoUpstream]:
    up = HeadEchoUpstream().start()
    yield up
    up.stop()


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[Callable[[int, Callable[[int], str]], LimitedGateway]]:
    started: list[LimitedGateway] = []

    def start(nofile: int, config: Callable[[int], str]) -> LimitedGateway:
        port = free_port()
        workdir = tmp_path / f"gw{len(started)}"
        workdir.mkdir()
        gw = LimitedGateway(workdir, config(port), port, nofile)
        started.append(gw)
        return gw.start()

    yield start
    for gw in started:
        gw.stop()


# -- the attacker ----------------------------------------------------------------------------------


def addresses(count: int, second_octet: int = 3) -> list[str]:
    """``count`` loopback addresses, none of them 127.0.0.1 (the normal client's)."""
    return [f"127.{second_octet + i // 62500}.{(i // 250) % 250 + 1}.{i % 250 + 1}" for i in range(count)]


def attack(
    port: int, sources: list[str], per_source: int, first: bytes, drip: bytes, stop_at: float, report: Path
) -> None:
    """Hold ``per_source`` connections from each source: each sends ``first``, then ``drip`` every
    few seconds; one the gateway closes (or refuses) is opened again, up to REFILL_PER_SECOND.
    Writes "opened held" to ``report`` at the end."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    os.nice(10)  # a real attacker's CPU is not the gateway's: on a shared test machine, it yields first
    poller = select.epoll()
    socks: dict[int, tuple[socket.socket, str, bool]] = {}  # fd -> (socket, source, connected)
    wanted = [source for source in sources for _ in range(per_source)]
    todo = list(wanted)
    opened = 0
    last_drip = time.monotonic()
    budget_window = time.monotonic()
    budget = REFILL_PER_SECOND // 10

    def open_one(source: str) -> None:
        nonlocal opened
        sock = socket.socket()
        sock.setblocking(False)
        try:
            sock.bind((source, 0))
        except OSError:
            sock.close()
            todo.append(source)
            return
        sock.connect_ex(("127.0.0.1", port))
        opened += 1
        socks[sock.fileno()] = (sock, source, False)
        poller.register(sock.fileno(), select.EPOLLOUT | select.EPOLLRDHUP)

    def drop(fd: int) -> None:
        sock, source, _ = socks.pop(fd)
        with contextlib.suppress(OSError):
            poller.unregister(fd)
        sock.close()
        todo.append(source)

    while time.monotonic() < stop_at:
        now = time.monotonic()
        if now - budget_window >= 0.1:
            budget_window, budget = now, REFILL_PER_SECOND // 10
        while todo and budget > 0:
            budget -= 1
            open_one(todo.pop())
        for fd, events in poller.poll(0.02):
            if fd not in socks:
                continue
            sock, source, connected = socks[fd]
            if events & (select.EPOLLERR | select.EPOLLHUP | select.EPOLLRDHUP | select.EPOLLIN):
                drop(fd)  # closed or reset by the gateway (or an answer: the attack is over for it)
                continue
            if not connected and events & select.EPOLLOUT:
                try:
                    sock.send(first)
                except OSError:
                    drop(fd)
                    continue
                socks[fd] = (sock, source, True)
                poller.modify(fd, select.EPOLLIN | select.EPOLLRDHUP)
        if drip and now - last_drip >= 3.0:
            last_drip = now
            for fd, (sock, _, connected) in list(socks.items()):
                if connected:
                    try:
                        sock.send(drip)
                    except OSError as exc:
                        if exc.errno != errno.EAGAIN:
                            drop(fd)
    held = sum(1 for _, _, connected in socks.values() if connected)
    report.write_text(f"{opened} {held}")
    for sock, _, _ in socks.values():
        sock.close()


class Attacker:
    """``attack`` in a process of its own (the gateway and the normal client each have theirs)."""

    def __init__(self, port: int, sources: list[str], per_source: int, first: bytes, drip: bytes, report: Path):
        self.report = report
        stop_at = time.monotonic() + RAMP_SECONDS + PROBE_SECONDS + 2
        context = multiprocessing.get_context("fork")
        self.proc = context.Process(
            target=attack, args=(port, sources, per_source, first, drip, stop_at, report), daemon=True
        )

    def __enter__(self) -> Attacker:
        self.proc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)

    def figures(self) -> tuple[int, int]:
        """(connections opened, connections held at the end)."""
        opened, held = self.report.read_text().split()
        return int(opened), int(held)


# -- the normal client -----------------------------------------------------------------------------


def probe(port: int) -> float | None:
    """One request on a new connection from 127.0.0.1: its time, or None if it went unanswered."""
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET /probe HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
    except OSError:
        return None
    if not data.startswith(b"HTTP/1.1 200"):
        return None
    return time.monotonic() - started


def probe_for(port: int, seconds: float) -> tuple[int, list[float]]:
    """Probe one request at a time, ten a second, for ``seconds``: (sent, answer times)."""
    sent, times = 0, []
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        sent += 1
        taken = probe(port)
        if taken is not None:
            times.append(taken)
        time.sleep(max(0.0, 0.1 - (taken or 0.0)))
    return sent, times


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def under_attack(gw: Gateway, attacker: Attacker, label: str) -> None:
    assert gw.proc is not None
    cpu_before, started = cpu_seconds(gw.proc.pid), time.monotonic()
    with attacker:
        time.sleep(RAMP_SECONDS)
        sent, times = probe_for(gw.port, PROBE_SECONDS)
    cpu = (cpu_seconds(gw.proc.pid) - cpu_before) / (time.monotonic() - started)
    opened, held = attacker.figures()
    median = statistics.median(times) if times else float("inf")
    print(
        f"\n{label}: normal client answered {len(times)} of {sent}, median {median * 1000:.1f} ms, "
        f"max {max(times, default=0) * 1000:.1f} ms; attacker opened {opened} connections, held {held}; "
        f"gateway CPU {cpu:.0%} of a core"
    )
    assert len(times) == sent, f"{sent - len(times)} of {sent} normal requests unanswered"
    assert median < 0.100
    assert gw.proc is not None and gw.proc.poll() is None
    assert "Traceback" not in gw.stderr()
    assert "Too many open files" not in gw.stderr()


def budget_line(gw: Gateway, nofile: int) -> str:
    line = next((ln for ln in gw.stderr().splitlines() if "serving at most" in ln), "")
    assert (
        f"worker_connections 10240 need more descriptors than the open file limit {nofile} allows: serving at most"
        in line
    ), gw.stderr()
    return line


LIMITS = [1024, 4096]


@pytest.mark.timing
@pytest.mark.parametrize("nofile", LIMITS)
def test_six_thousand_half_header_senders(limited, raw_upstream, tmp_path, nofile):
    gw = limited(nofile, lambda port: basic_config(port, [raw_upstream.address]))
    budget_line(gw, nofile)
    attacker = Attacker(gw.port, addresses(6000), 1, b"GET / HTTP/1.1\r\nHost: a\r\nX-a: ", b"", tmp_path / "a")
    under_attack(gw, attacker, f"6,000 half-header senders, nofile {nofile}")


@pytest.mark.timing
@pytest.mark.parametrize("nofile", LIMITS)
def test_slow_bodies_from_45_addresses(limited, raw_upstream, tmp_path, nofile):
    gw = limited(nofile, lambda port: basic_config(port, [raw_upstream.address]))
    budget_line(gw, nofile)
    head = b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 100
    attacker = Attacker(gw.port, addresses(45, 5), 256, head, b"x", tmp_path / "a")
    under_attack(gw, attacker, f"slow bodies from 45 addresses, nofile {nofile}")
    assert "closing request bodies slower than client_body_min_rate" in gw.stderr()


def partial_client_hello() -> bytes:
    """The first 40 bytes of a real ClientHello: the handshake has begun, and stalls."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="site.test")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()[:40]


def tls_config(tls_port: int, ca: TestCA, upstream: HeadEchoUpstream) -> Callable[[int], str]:
    cert = ca.issue("site", "site.test")

    def config(port: int) -> str:
        return basic_config(port, [upstream.address]).replace(
            f"listen: 127.0.0.1:{port}\n",
            f'listen:\n  - 127.0.0.1:{port}\n  - {{address: "127.0.0.1:{tls_port}", ssl: true}}\n'
            f"ssl_certificate: {cert.cert}\nssl_certificate_key: {cert.key}\n",
        )

    return config


def tls_handshake_works(port: int, ca: TestCA) -> bool:
    context = ssl.create_default_context(cafile=str(ca.bundle))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="site.test") as tls,
    ):
        tls.sendall(b"GET / HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\n\r\n")
        return tls.recv(12) == b"HTTP/1.1 200"


@pytest.mark.timing
@pytest.mark.parametrize("nofile", LIMITS)
@pytest.mark.parametrize("spread", [False, True], ids=["one-address", "6000-addresses"])
def test_stalled_tls_handshakes(limited, raw_upstream, tmp_path, nofile, spread):
    ca = TestCA(tmp_path / "pki")
    tls_port = free_port()
    gw = limited(nofile, tls_config(tls_port, ca, raw_upstream))
    wait_port(tls_port, proc=gw.proc)
    budget_line(gw, nofile)
    sources, per_source = (addresses(6000, 7), 1) if spread else (["127.0.0.9"], 6000)
    attacker = Attacker(tls_port, sources, per_source, partial_client_hello(), b"", tmp_path / "a")
    under_attack(gw, attacker, f"stalled TLS handshakes from {len(sources)} address(es), nofile {nofile}")
    if not spread:
        assert "limiting connections by max_connections_per_ip (256), client: 127.0.0.9" in gw.stderr()
    assert tls_handshake_works(tls_port, ca)
