"""Ports for the processes a test starts: one ``free_port`` for everything, and ``wait_port``."""

from __future__ import annotations

import random
import socket
import subprocess
import threading
import time
from pathlib import Path

HOST = "127.0.0.1"
CLUSTER_BUS_OFFSET = 10000  # Redis Cluster's bus listens on port + 10000

_port_lock = threading.Lock()
_ports_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_is_free(port: int, host: str = HOST) -> bool:
    """True if nothing is bound to host:port (a listener on 0.0.0.0 also counts)."""
    if not 0 < port < 65536:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(*, cluster_bus: bool = False, attempts: int = 500) -> int:
    """A port on 127.0.0.1 that nothing listens on right now.

    Ports are drawn at random from below the kernel's ephemeral range (so an outgoing
    connection cannot take them between the probe and the bind), and never handed out twice
    in one test run (a test that asks for two, listen and admin, must not get one twice).
    With ``cluster_bus=True`` port + 10000 must be free too (Redis Cluster's bus port).
    There is still a small window between the probe and the bind: ``RedisServer.start`` and
    the ``gateway_factory`` fixture retry on a new port when the bind fails.
    """
    low = 10000
    high = _ephemeral_low() - 1  # inclusive
    if cluster_bus:
        high -= CLUSTER_BUS_OFFSET
    if high - low < 100:  # odd ephemeral range: fall back to the whole space
        high = 65535 - (CLUSTER_BUS_OFFSET if cluster_bus else 0)
    rng = random.SystemRandom()
    with _port_lock:
        for _ in range(attempts):
            port = rng.randint(low, high)
            candidates = (port, port + CLUSTER_BUS_OFFSET) if cluster_bus else (port,)
            if any(p in _ports_handed_out for p in candidates):
                continue
            if all(port_is_free(p) for p in candidates):
                _ports_handed_out.update(candidates)
                return port
    raise RuntimeError(f"no free port found in {attempts} attempts (cluster_bus={cluster_bus})")


def wait_port(port: int, host: str = HOST, timeout: float = 10.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Return once something accepts connections on host:port; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")
