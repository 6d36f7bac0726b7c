"""The gateway speaks systemd's readiness protocol (``Type=notify``) to ``$NOTIFY_SOCKET``.

A datagram socket stands in for systemd; it receives each message with its sender's pid
(SO_PASSCRED), as systemd does to ignore all but the main process (``NotifyAccess=main``).
"""

from __future__ import annotations

import signal
import socket
import struct
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.config import basic_config
from tests.support.gateway import Gateway
from tests.support.ports import free_port

Message = tuple[int, dict[str, str]]  # sender pid, fields


@pytest.fixture
def systemd() -> Iterator[tuple[socket.socket, str]]:
    directory = tempfile.mkdtemp(prefix="notify-")  # short: a socket path holds 108 bytes
    path = str(Path(directory) / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    sock.bind(path)
    try:
        yield sock, path
    finally:
        sock.close()
        Path(path).unlink(missing_ok=True)
        Path(directory).rmdir()


def receive(sock: socket.socket, timeout: float) -> Message | None:
    sock.settimeout(timeout)
    try:
        data, ancillary, _, _ = sock.recvmsg(4096, socket.CMSG_SPACE(12))
    except TimeoutError:
        return None
    pid = 0
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid = struct.unpack("iII", payload[:12])[0]
    fields = dict(line.split("=", 1) for line in data.decode().splitlines())
    return pid, fields


def expect(sock: socket.socket, field: str, timeout: float = 20.0) -> Message:
    message = receive(sock, timeout)
    assert message is not None, f"no {field} within {timeout}s"
    assert field in message[1], message
    return message


def config(port: int, workers: int = 1) -> str:
    return basic_config(port, ["127.0.0.1:9"], rest=f"workers: {workers}\nadmin: {{listen: off}}\npid: off\n")


def test_ready_reloading_stopping_from_a_single_process(tmp_path: Path, systemd: tuple[socket.socket, str]) -> None:
    sock, path = systemd
    port = free_port()
    gateway = Gateway(tmp_path, config(port), port, env={"NOTIFY_SOCKET": path}).start()
    try:
        assert gateway.proc is not None
        pid, fields = expect(sock, "READY")
        assert (pid, fields) == (gateway.proc.pid, {"READY": "1", "STATUS": f"serving on 127.0.0.1:{port}"})

        gateway.signal(signal.SIGHUP)
        pid, fields = expect(sock, "RELOADING")
        assert pid == gateway.proc.pid and fields["RELOADING"] == "1"
        assert abs(int(fields["MONOTONIC_USEC"]) - time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000) < 30_000_000
        assert expect(sock, "READY")[1] == {"READY": "1", "STATUS": "serving; configuration reloaded"}

        gateway.write_config(config(port) + "zones: [\n")
        gateway.signal(signal.SIGHUP)
        expect(sock, "RELOADING")
        status = expect(sock, "READY")[1]["STATUS"]
        assert status == "reload failed, running the previous configuration: see the error log"

        gateway.signal(signal.SIGTERM)
        assert expect(sock, "STOPPING") == (gateway.proc.pid, {"STOPPING": "1"})
        assert gateway.proc.wait(20) == 0
    finally:
        gateway.stop()


def test_with_workers_only_the_master_speaks(tmp_path: Path, systemd: tuple[socket.socket, str]) -> None:
    sock, path = systemd
    port = free_port()
    gateway = Gateway(tmp_path, config(port, workers=2), port, env={"NOTIFY_SOCKET": path}).start()
    try:
        assert gateway.proc is not None
        master = gateway.proc.pid
        assert expect(sock, "READY") == (master, {"READY": "1", "STATUS": "serving with 2 workers"})
        gateway.signal(signal.SIGHUP)
        assert expect(sock, "RELOADING")[0] == master
        assert expect(sock, "READY")[0] == master
        time.sleep(1.0)  # the workers reload too: none of them may say a word
        gateway.signal(signal.SIGTERM)
        assert expect(sock, "STOPPING") == (master, {"STOPPING": "1"})
        assert gateway.proc.wait(30) == 0
        assert receive(sock, 0.5) is None
    finally:
        gateway.stop()
