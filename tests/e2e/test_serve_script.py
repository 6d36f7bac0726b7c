"""``scripts/serve``, run as a user runs it: its ports are checked before anything starts.

A taken port stops it with one line that names the port, what it was for, and how to pick
others (exit 1), instead of a traceback and a gateway serving in front of a stranger.
``GATEWAY_PORT``, ``GATEWAY_ADMIN_PORT`` and ``DEMO_PORTS`` (or ``--port``, ``--admin-port``,
``--demo-ports``) move the ports. Every port here is a free one: the defaults (8080, 9180,
9000, 9001) may be anyone's on a shared machine. The script runs from this checkout, whose
``.venv`` it finds installed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.ports import free_port, wait_port

SERVE = ROOT / "scripts" / "serve"

pytestmark = pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "python").exists(), reason="no .venv in the checkout")


@contextmanager
def held_port() -> Iterator[int]:
    """A port some other program listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def env_with(**ports: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GATEWAY_PORT", "GATEWAY_ADMIN_PORT", "DEMO_PORTS")}
    env.update(ports)
    return env


def serve(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SERVE), *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60, start_new_session=True
    )


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_a_taken_demo_port_is_one_line_and_nothing_starts() -> None:
    gateway, admin, other = free_port(), free_port(), free_port()
    with held_port() as taken:
        env = env_with(GATEWAY_PORT=str(gateway), GATEWAY_ADMIN_PORT=str(admin), DEMO_PORTS=f"{taken},{other}")
        proc = serve(env=env)
        assert not listening(gateway) and not listening(admin) and not listening(other)
    assert proc.returncode == 1
    assert proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"scripts/serve: port {taken} (the demo upstream) is taken on 127.0.0.1: pick others with `")
    assert "DEMO_PORTS=" in line and "--demo-ports " in line
    assert "Traceback" not in proc.stderr


def test_a_taken_gateway_port_given_by_flag_names_the_flag() -> None:
    admin, demo_a, demo_b = free_port(), free_port(), free_port()
    with held_port() as taken:
        proc = serve(
            "--port", str(taken), "--admin-port", str(admin), "--demo-ports", f"{demo_a},{demo_b}", env=env_with()
        )
    assert proc.returncode == 1
    [line] = proc.stderr.splitlines()
    assert f"port {taken} (the gateway) is taken" in line
    assert "GATEWAY_PORT=" in line and "--port " in line
    assert "DEMO_PORTS" not in line  # only what is taken is to be moved


def test_a_port_that_is_not_a_number_is_a_usage_line() -> None:
    proc = serve(env=env_with(DEMO_PORTS="9000"))
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith("scripts/serve: DEMO_PORTS / --demo-ports must be two port numbers A,B, got '9000'")


def test_the_variables_move_every_port(tmp_path: Path) -> None:
    gateway, admin, demo_a, demo_b = free_port(), free_port(), free_port(), free_port()
    env = env_with(GATEWAY_PORT=str(gateway), GATEWAY_ADMIN_PORT=str(admin), DEMO_PORTS=f"{demo_a},{demo_b}")
    err = (tmp_path / "stderr").open("w+")
    proc = subprocess.Popen(
        [str(SERVE)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
    )
    try:
        wait_port(gateway, timeout=120, proc=proc)  # the first run may install the package
        for port in (admin, demo_a, demo_b):
            wait_port(port, timeout=10, proc=proc)
        servers = set()
        for _ in range(6):  # upstream app balances over both demo ports
            with urllib.request.urlopen(f"http://127.0.0.1:{gateway}/api/hello", timeout=10) as response:
                assert response.status == 200
                servers.add(json.load(response)["server"])
        assert servers == {f"127.0.0.1:{demo_a}", f"127.0.0.1:{demo_b}"}
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/healthz", timeout=10) as response:
            assert response.status == 200
        err.seek(0)
        said = err.read()
        config = f".venv/serve-{gateway}.yaml"
        assert f"scripts/serve: ports {gateway} (gateway), {admin} (admin API): the CLI takes -c {config}" in said
        check = subprocess.run(
            [str(ROOT / ".venv" / "bin" / "gateway"), "reload", "-c", config], cwd=ROOT, capture_output=True, text=True
        )
        assert (check.returncode, check.stdout) == (0, "reloaded\n"), check.stderr
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the script, its gateway and its demo upstream
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        err.close()
        (ROOT / ".venv" / f"serve-{gateway}.yaml").unlink(missing_ok=True)
