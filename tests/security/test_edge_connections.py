"""Connection exhaustion from one host, or many: caps, reuse of idle connections, timeouts.

The attack sockets are plain non-blocking sockets of this test process (many from one
address, or spread over 127.0.0.0/8, which is all local on Linux); a normal client
keeps being timed meanwhile. The gateway runs through its CLI; its open descriptors
are read from /proc.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.runtime.listeners import BACKLOG
from tests.support.config import basic_config
from tests.support.upstreams import HeadEchoUpstream


@pytest.fixture(autouse=True)
def many_files() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture
def raw_upstream() -> Iterator[HeadEchoUpstream]:
    up = HeadEchoUpstream().start()
    yield up
    up.stop()


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


BATCH = BACKLOG // 2  # connections opened between two looks at the accept queue


def open_sockets(port: int, count: int, sources: list[str], payload: bytes) -> list[socket.socket]:
    """``count`` connections, round-robin over ``sources``, each having sent ``payload``.

    They are opened as fast as the gateway accepts them: a batch goes only when the accept
    queue has room for it. A connection the kernel refused for a full queue retries its SYN
    1 s, 3 s, 7 s later, in bursts that fill the queue again and drop a normal client's SYN
    (one more second for it). That is the kernel under a SYN flood, paced by the machine's
    speed, not the gateway holding a flood of open connections, which is what is measured."""
    socks = []
    for i in range(count):
        if i % BATCH == 0:
            wait_for_accept_room(port, BATCH)
        sock = socket.socket()
        sock.setblocking(False)
        sock.bind((sources[i % len(sources)], 0))
        sock.connect_ex(("127.0.0.1", port))
        socks.append(sock)
    wait_for_accept_room(port, BACKLOG)
    time.sleep(0.3)
    for sock in socks:
        with contextlib.suppress(OSError):  # reset by the gateway already
            sock.send(payload)
    return socks


def alive(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the gateway has not closed (a closed one reads EOF or a reset)."""
    count = 0
    for sock in socks:
        try:
            data = sock.recv(1, socket.MSG_PEEK)
            if data:
                count += 1
        except BlockingIOError:
            count += 1
        except OSError:
            pass
    return count


def tcp_table() -> Iterator[list[str]]:
    """The fields of each IPv4 TCP socket of this network namespace, from /proc/net/tcp:
    [1] local address:port, [3] state, [4] tx_queue:rx_queue, all in hex."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        yield line.split()


def accept_queue(port: int) -> int:
    """Connections in the kernel's accept queue of ``port``'s listeners, not yet accepted: for a
    listening socket, /proc/net/tcp's rx_queue field is that count."""
    listening = (f"0100007F:{port:04X}", f"00000000:{port:04X}")  # 127.0.0.1 or any address
    return sum(int(f[4].split(":")[1], 16) for f in tcp_table() if f[3] == "0A" and f[1] in listening)  # LISTEN


def wait_for_accept_room(port: int, room: int, limit: float = 10.0) -> None:
    """Until the accept queue has ``room`` free places of its ``BACKLOG`` (or ``limit`` seconds)."""
    deadline = time.monotonic() + limit
    while accept_queue(port) > BACKLOG - room and time.monotonic() < deadline:
        time.sleep(0.005)


def timed_request(port: int, source: str = "127.0.0.1") -> float:
    started = time.monotonic()
    with socket.socket() as sock:
        sock.settimeout(5)
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /probe HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200"), data[:100]
    return time.monotonic() - started


def established_to(port: int) -> int:
    """Server-side TCP connections of ``port`` that are established (accepted or in the accept queue).

    Read from /proc/net/tcp: the client side of a flood can hold half-open sockets the kernel
    dropped from a full SYN queue, which says nothing about the gateway."""
    listening = f"0100007F:{port:04X}"  # 127.0.0.1:port; attack sockets never use 127.0.0.1, and one of
    # them may get the same port number
    return sum(1 for f in tcp_table() if f[1] == listening and f[3] in ("01", "08"))  # ESTABLISHED, CLOSE_WAIT


def listen_overflows() -> int:
    """The kernel's count of connections dropped for a full accept queue (this network namespace)."""
    names, values = Path("/proc/net/netstat").read_text().splitlines()[:2]
    return int(dict(zip(names.split(), values.split(), strict=True))["ListenOverflows"])


def close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.close()


def test_max_connections_per_ip_resets_the_excess_before_parsing(gateway_factory, raw_upstream):
    gw = gateway_factory(lambda port: basic_config(port, [raw_upstream.address]) + "max_connections_per_ip: 20\n")
    socks = open_sockets(gw.port, 60, ["127.0.0.9"], b"GET / HTTP/1.1\r\n")
    try:
        time.sleep(0.3)
        assert alive(socks) == 20
        assert timed_request(gw.port, "127.0.0.10") < 1  # another client is served
        assert "limiting connections by max_connections_per_ip (20), client: 127.0.0.9" in gw.stderr()
    finally:
        close_all(socks)


def test_peers_in_real_ip_from_are_exempt(gateway_factory, raw_upstream):
    gw = gateway_factory(
        lambda port: (
            basic_config(port, [raw_upstream.address]) + "max_connections_per_ip: 5\nreal_ip: {from: [127.0.0.11/32]}\n"
        )
    )
    socks = open_sockets(gw.port, 30, ["127.0.0.11"], b"GET / HTTP/1.1\r\n")
    try:
        time.sleep(0.3)
        assert alive(socks) == 30
    finally:
        close_all(socks)


def test_near_worker_connections_the_oldest_idle_connections_make_room(gateway_factory, raw_upstream):
    gw = gateway_factory(
        lambda port: basic_config(port, [raw_upstream.address]) + "worker_connections: 100\nmax_connections_per_ip: 0\n"
    )
    socks = open_sockets(gw.port, 300, [f"127.0.1.{i}" for i in range(1, 60)], b"GET / HTTP/1.1\r\nX-Slow: ")
    try:
        time.sleep(0.3)
        assert alive(socks) <= 100
        assert alive(socks[-50:]) == 50, "the newest connections are kept, the oldest made room"
        for _ in range(20):
            assert timed_request(gw.port, "127.0.2.1") < 1
        assert "100 worker_connections are not enough, reusing connections" in gw.stderr()
    finally:
        close_all(socks)


def test_a_busy_connection_is_never_taken_for_room(gateway_factory, upstream):
    """A request in flight (waiting on a slow upstream) is not reusable: with no room, new ones are refused."""
    gw = gateway_factory(lambda port: basic_config(port, [upstream.address]) + "worker_connections: 16\n")
    busy = []
    for _ in range(16):
        sock = socket.create_connection(("127.0.0.1", gw.port))
        sock.sendall(b"GET /slow?ms=1500 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        busy.append(sock)
    time.sleep(0.5)
    try:
        with socket.create_connection(("127.0.0.1", gw.port)) as extra:
            extra.settimeout(3)
            extra.sendall(b"GET /echo HTTP/1.1\r\nHost: a\r\n\r\n")
            with pytest.raises(ConnectionResetError):
                while extra.recv(1024):
                    pass
        for sock in busy:
            sock.settimeout(5)
            assert sock.recv(64).startswith(b"HTTP/1.1 200")
        assert "16 worker_connections are not enough" in gw.stderr()
    finally:
        close_all(busy)


def test_client_header_timeout_counts_the_whole_header(gateway_factory, raw_upstream):
    gw = gateway_factory(lambda port: basic_config(port, [raw_upstream.address]) + "client_header_timeout: 1s\n")
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.settimeout(5)
        started = time.monotonic()
        closed_at = None
        for byte in b"GET / HTTP/1.1\r\nHost: a\r\nX-Drip: aaaaaaaaaaaaaaaaaaaaaaa":  # slowloris: a byte every 100 ms
            try:
                sock.send(bytes([byte]))
            except OSError:
                closed_at = time.monotonic()
                break
            time.sleep(0.1)
        if closed_at is None:
            assert sock.recv(1) == b""
            closed_at = time.monotonic()
    assert 0.9 < closed_at - started < 2.0


@pytest.mark.timing
def test_an_idle_connection_gets_keepalive_timeout_and_no_more(gateway_factory, raw_upstream):
    gw = gateway_factory(
        lambda port: basic_config(port, [raw_upstream.address]) + "client_header_timeout: 10s\nkeepalive_timeout: 1s\n"
    )
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.settimeout(5)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        reader = sock.makefile("rb")
        assert reader.readline().startswith(b"HTTP/1.1 200")
        length = 0
        while (line := reader.readline()) != b"\r\n":
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        assert len(reader.read(length)) == length  # the whole response: the connection is idle now
        answered = time.monotonic()
        time.sleep(0.5)
        sock.sendall(b"GET / HTTP/1.1\r\n")  # the next header starts, and stalls
        assert sock.recv(1) == b""
        assert time.monotonic() - answered < 2.0, "the idle budget is not renewed by a partial header"


def test_keepalive_timeout_zero_closes_after_each_response(gateway_factory, raw_upstream):
    gw = gateway_factory(lambda port: basic_config(port, [raw_upstream.address]) + "keepalive_timeout: 0\n")
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.settimeout(5)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200") and b"\r\nConnection: close\r\n" in data


def test_send_timeout_closes_a_client_that_stops_reading(gateway_factory, upstream):
    gw = gateway_factory(lambda port: basic_config(port, [upstream.address]) + "send_timeout: 1s\nlog: {level: info}\n")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", gw.port))
    try:
        sock.sendall(b"GET /download/104857600 HTTP/1.1\r\nHost: a\r\n\r\n")
        time.sleep(0.3)
        baseline = fd_count(gw.proc.pid)
        deadline = time.monotonic() + 6
        while fd_count(gw.proc.pid) >= baseline and time.monotonic() < deadline:
            time.sleep(0.1)
        assert fd_count(gw.proc.pid) < baseline, "the stalled client connection was not closed"
        assert "while sending to client" in gw.stderr()
    finally:
        sock.close()


@pytest.mark.timing
@pytest.mark.slow
@pytest.mark.parametrize("spread", [False, True], ids=["one-address", "spread-over-127/8"])
def test_fifteen_thousand_idle_and_slowloris_sockets_do_not_take_the_gateway_down(
    gateway_factory, raw_upstream, spread
):
    """The issue's target: 15,000 idle or slowloris sockets from one address, or spread over
    127.0.0.0/8; a normal client keeps a p99 under 100 ms while they are held, and within
    client_header_timeout the gateway's descriptors are back to their baseline."""
    header_timeout = 30  # long enough for a busy machine to open the flood and probe while it is held
    gw = gateway_factory(
        lambda port: basic_config(port, [raw_upstream.address]) + f"client_header_timeout: {header_timeout}s\n"
    )
    pid = gw.proc.pid
    for _ in range(5):
        timed_request(gw.port)
    baseline = fd_count(pid)
    if spread:
        sources = [f"127.{a}.{b}.{c}" for a in (3, 4) for b in range(1, 31) for c in range(1, 251)][:15_000]
    else:
        sources = ["127.0.0.5"]
    half = 7_500
    flood_began = time.monotonic()
    idle = open_sockets(gw.port, half, sources[:half] if spread else sources, b"")
    slow = open_sockets(gw.port, half, sources[half:] if spread else sources, b"GET / HTTP/1.1\r\nX-a: ")
    attack = idle + slow
    opened = time.monotonic()
    try:
        settle_until = opened + 5  # the gateway absorbs the flood (about 90 us of CPU per connection)
        previous = -1
        while time.monotonic() < settle_until and fd_count(pid) != previous:
            previous = fd_count(pid)
            time.sleep(0.3)
        held = fd_count(pid) - baseline
        latencies = []
        overflows = listen_overflows()
        started = time.monotonic()
        while time.monotonic() - started < 2.5:
            latencies.append(timed_request(gw.port, "127.0.0.1"))
            for sock in slow[:200]:
                with contextlib.suppress(OSError):
                    sock.send(b"b")  # slowloris keeps dripping
        probed = time.monotonic()
        still_held = fd_count(pid) - baseline
        p99 = statistics.quantiles(latencies, n=100)[98] if len(latencies) >= 100 else max(latencies)
        print(
            f"\n{len(latencies)} probe requests under attack: p99 {p99 * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms,"
            f" attack connections held {held} before, {still_held} after; flood opened in {opened - flood_began:.1f} s,"
            f" probed until {probed - flood_began:.1f} s; accept queue overflows meanwhile {listen_overflows() - overflows}"
        )
        # measured under attack: the flood holds the budget (spread) or its address's share of it
        assert still_held >= (7_000 if spread else 100), "the flood was no longer held while probing"
        assert p99 < 0.100
        assert fd_count(pid) <= baseline + 10_240 + 50  # never more than worker_connections
        # client_header_timeout runs from accept. Past the budget, the kernel holds the rest of the
        # flood in the listen queue; they are accepted as the first wave is reclaimed (a busy machine
        # reclaims later) and each gets its own timeout: the last is closed within two timeouts.
        deadline = opened + 2 * header_timeout + 3
        while (fd_count(pid) > baseline + 2 or established_to(gw.port)) and time.monotonic() < deadline:
            time.sleep(0.2)
        print(f"fds back to {fd_count(pid)} (baseline {baseline}), {established_to(gw.port)} established")
        assert fd_count(pid) <= baseline + 2
        assert established_to(gw.port) == 0, "nothing stays open, not even in the accept queue"
        # served at once again: the best of three, so that one stall of the machine is not a failure
        assert min(timed_request(gw.port) for _ in range(3)) < 0.1
    finally:
        close_all(attack)
    assert Path(f"/proc/{pid}").exists()
