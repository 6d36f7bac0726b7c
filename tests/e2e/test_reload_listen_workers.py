"""A reload changes ``listen`` and ``workers`` without a restart, and drops nothing under load.

The load is ``wrk`` (Debian's package, installed by scripts/test) against the gateway started
through its CLI; wrk counts every request a closed or reset connection loses as a socket error.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest

from tests.support.gateway import Gateway, cli
from tests.support.http import status
from tests.support.ports import free_port
from tests.support.upstreams import Upstream


def config(upstream: Upstream, admin: int, listen: list[int], workers: int) -> str:
    addresses = ", ".join(f"127.0.0.1:{p}" for p in listen)
    return f"""
listen: [{addresses}]
workers: {workers}
shutdown_timeout: 5s
admin: {{listen: 127.0.0.1:{admin}, token: s3cret}}
upstreams:
  app: {{servers: [{upstream.address}]}}
routes:
  - {{location: /, upstream: app}}
"""


def refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except ConnectionRefusedError:
        return True


def read_to_eof(sock: socket.socket) -> bytes:
    data = b""
    with sock:
        while chunk := sock.recv(65536):
            data += chunk
    return data


def read_response(sock: socket.socket) -> bytes:
    """One whole response with a Content-Length, leaving the connection open."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


async def wait_for(predicate, timeout: float = 15.0, why=lambda: "") -> None:
    """Until ``predicate()``; on timeout the assertion carries ``why()`` (say, the gateway's log)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out\n{why()}"
        await asyncio.sleep(0.05)


def workers_of(admin: int) -> list[int]:
    import json
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{admin}/status", headers={"Authorization": "Bearer s3cret"})
    with urllib.request.urlopen(request, timeout=5) as resp:
        return list(json.load(resp)["workers"])


async def test_single_process_reload_adds_and_removes_listeners(gateway_factory, upstream):
    admin, extra = free_port(), free_port()
    gw = gateway_factory(lambda port: config(upstream, admin, [port], 1))
    conf = str(gw.config_path)
    assert refused(extra)
    gw.write_config(config(upstream, admin, [gw.port, extra], 1))
    done = cli("reload", "-c", conf)
    assert (done.returncode, done.stdout) == (0, "reloaded\n"), done.stderr
    assert await status(f"http://127.0.0.1:{extra}/echo", timeout=5) == 200
    # a keep-alive connection on the listener about to go: its request in flight finishes,
    # then the connection closes (EOF after the response)
    client = socket.create_connection(("127.0.0.1", extra), timeout=5)
    client.sendall(b"GET /slow?ms=800 HTTP/1.1\r\nHost: gw\r\n\r\n")
    await asyncio.sleep(0.3)
    gw.write_config(config(upstream, admin, [gw.port], 1))
    assert cli("reload", "-c", conf).returncode == 0
    received = await asyncio.to_thread(read_to_eof, client)
    assert received.startswith(b"HTTP/1.1 200") and b"\r\n\r\nslow up" in received, received
    await wait_for(lambda: refused(extra))
    assert await status(gw.url + "/echo", timeout=5) == 200
    assert f"stopped listening on 127.0.0.1:{extra}" in gw.stderr()
    # an idle keep-alive connection on a listener a reload removes is closed (EOF, no reset)
    gw.write_config(config(upstream, admin, [gw.port, extra], 1))
    assert cli("reload", "-c", conf).returncode == 0
    idle = socket.create_connection(("127.0.0.1", extra), timeout=5)
    idle.sendall(b"GET /echo HTTP/1.1\r\nHost: gw\r\n\r\n")
    assert read_response(idle).startswith(b"HTTP/1.1 200")
    gw.write_config(config(upstream, admin, [gw.port], 1))
    assert cli("reload", "-c", conf).returncode == 0
    assert await asyncio.to_thread(read_to_eof, idle) == b""


async def test_a_listen_port_that_cannot_be_bound_fails_the_reload_and_keeps_the_old_set(gateway_factory, upstream):
    admin = free_port()
    for workers in (1, 2):
        taken = socket.create_server(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        try:
            gw = gateway_factory(lambda port, w=workers: config(upstream, admin, [port], w))
            await wait_for(lambda gw=gw, w=workers: gw.stderr().count("listening on") >= w)
            gw.write_config(config(upstream, admin, [gw.port, busy], workers))
            failed = cli("reload", "-c", str(gw.config_path))
            assert failed.returncode == 1
            assert f"bind() to 127.0.0.1:{busy} failed (Address already in use)" in failed.stderr
            assert "reload failed, keeping the running configuration and listeners" in gw.stderr()
            assert await status(gw.url + "/echo", timeout=5) == 200
        finally:
            taken.close()
        gw.stop()


async def test_workers_1_to_2_on_a_single_process_says_it_needs_a_restart(gateway_factory, upstream):
    admin = free_port()
    gw = gateway_factory(lambda port: config(upstream, admin, [port], 1))
    gw.write_config(config(upstream, admin, [gw.port], 2) + "pid: elsewhere.pid\n")
    done = cli("reload", "-c", str(gw.config_path))
    assert done.returncode == 0 and done.stdout == "reloaded\n"
    assert "workers: 1 -> 2 needs a restart" in done.stderr
    assert "gateway: note: pid changes take effect on restart, not on reload" in done.stderr
    assert "workers: 1 -> 2 needs a restart" in gw.stderr()


def wrk_binary() -> str:
    found = shutil.which("wrk")
    if found is None:
        pytest.skip("wrk is not installed (scripts/test installs Debian's wrk)")
    return found


class Wrk:
    def __init__(self, url: str, seconds: int) -> None:
        self.proc = subprocess.Popen(
            [wrk_binary(), "-t2", "-c50", f"-d{seconds}s", "--timeout", "5s", url],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.output = ""
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            self.output = self.proc.stdout.read()
        self.proc.wait()

    def result(self) -> tuple[int, str]:
        self._thread.join(60)
        match = re.search(r"(\d+) requests in", self.output)
        assert match, self.output
        return int(match.group(1)), self.output

    async def stop_and_check(self) -> None:
        """Stop wrk (it must still be running: every reload happened under load) and check
        that it got no socket error and no non-2xx answer over more than 1,000 requests."""
        assert self.proc.poll() is None, "every reload must happen under load: wrk ended too soon"
        self.proc.send_signal(signal.SIGINT)
        requests, output = await asyncio.to_thread(self.result)
        print(output)
        assert requests > 1000, output
        assert "Socket errors" not in output, output
        assert "Non-2xx or 3xx responses" not in output, output


async def test_reloads_of_listen_and_workers_drop_no_request_under_wrk_load(gateway_factory, upstream):
    admin, extra = free_port(), free_port()
    gw: Gateway = gateway_factory(lambda port: config(upstream, admin, [port], 2))
    conf = str(gw.config_path)
    await wait_for(
        lambda: len(workers_of(admin)) == 2 and gw.stderr().count("listening on") >= 2,
        why=lambda: f"workers {workers_of(admin)}; the gateway's log:\n{gw.stderr()[-4000:]}",
    )
    load = Wrk(gw.url + "/echo", seconds=120)  # stopped (SIGINT: it reports then) after the reloads
    await asyncio.sleep(1.0)
    steps = [
        ([gw.port, extra], 2),  # an unrelated listener added
        ([gw.port, extra], 3),  # a worker more
        ([gw.port], 3),  # the listener removed
        ([gw.port], 2),  # the surplus worker retired
    ]
    for listen, workers in steps:
        gw.write_config(config(upstream, admin, listen, workers))
        done = cli("reload", "-c", conf)
        assert done.returncode == 0, done.stderr
        await wait_for(lambda w=workers: len(workers_of(admin)) == w)
        if extra in listen:
            await wait_for(lambda: gw.stderr().count(f"listening on 127.0.0.1:{extra}") >= 2)
            assert await status(f"http://127.0.0.1:{extra}/echo", timeout=5) == 200
        await asyncio.sleep(1.0)
    await load.stop_and_check()
    assert refused(extra)
    assert gw.stderr().count("retired") == 1


async def test_single_process_listen_reloads_drop_no_request_under_wrk_load(gateway_factory, upstream):
    admin, extra = free_port(), free_port()
    gw: Gateway = gateway_factory(lambda port: config(upstream, admin, [port], 1))
    conf = str(gw.config_path)
    load = Wrk(gw.url + "/echo", seconds=120)
    await asyncio.sleep(1.0)
    for listen in ([gw.port, extra], [gw.port], [gw.port, extra], [gw.port]):
        gw.write_config(config(upstream, admin, listen, 1))
        done = cli("reload", "-c", conf)
        assert done.returncode == 0, done.stderr
        assert refused(extra) == (extra not in listen)
        await asyncio.sleep(0.5)
    await load.stop_and_check()
    assert gw.stderr().count(f"stopped listening on 127.0.0.1:{extra}") == 2
