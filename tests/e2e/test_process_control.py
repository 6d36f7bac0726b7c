"""The pid file, ``gateway stop`` and ``gateway reload --pid``, through the real CLI."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from tests.support.config import config
from tests.support.gateway import cli
from tests.support.paths import ROOT
from tests.support.ports import free_port
from tests.support.upstreams import Upstream


def plain(upstream: Upstream, extra: str = "") -> Callable[[int], str]:
    return config(upstream, top="shutdown_timeout: 5s", admin="{listen: off}", extra=extra)


async def wait_for(predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


async def test_pid_file_written_at_start_and_stop_drains_and_removes_it(gateway_factory, upstream):
    gw = gateway_factory(plain(upstream, "pid: run/gw.pid\n"))  # relative: to the config file's directory
    pid_file = gw.config_path.parent / "run" / "gw.pid"
    assert gw.proc is not None
    await wait_for(pid_file.exists)
    assert pid_file.read_text() == f"{gw.proc.pid}\n"
    # a slow request in flight when stop comes: it finishes, then the process exits
    async with aiohttp.ClientSession() as session:
        slow = asyncio.ensure_future(session.get(gw.url + "/slow?ms=1000"))
        await asyncio.sleep(0.3)
        stopped = await asyncio.to_thread(cli, "stop", "-c", str(gw.config_path), "--timeout", "20s")
        resp = await slow
        assert resp.status == 200
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout == f"stopped (pid {gw.proc.pid})\n"
    assert gw.proc.wait(5) == 0
    assert not pid_file.exists()
    again = cli("stop", "-c", str(gw.config_path))
    assert again.returncode == 1 and "no pid file at" in again.stderr


async def test_a_second_start_is_refused_and_a_stale_pid_file_is_taken_over(gateway_factory, upstream, tmp_path):
    pid_file = tmp_path / "gateway.pid"
    pid_file.write_text(f"{dead_pid()}\n")  # stale: left by a gateway that was killed
    gw = gateway_factory(plain(upstream, f"pid: {pid_file}\n"))
    assert gw.proc is not None
    await wait_for(lambda: pid_file.read_text() == f"{gw.proc.pid}\n")
    assert f"took over the stale pid file {pid_file}" in gw.stderr()
    second = subprocess.run(
        [sys.executable, "-m", "gateway", "run", "-c", str(gw.config_path), "--listen", f"127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
    )
    assert second.returncode == 1
    assert f"another gateway is running (pid {gw.proc.pid}, pid file {pid_file})" in second.stderr
    assert pid_file.read_text() == f"{gw.proc.pid}\n"  # untouched by the refused start
    assert gw.stop() == 0
    assert not pid_file.exists()


async def test_the_default_pid_file_is_in_the_runtime_dir_and_reload_and_stop_find_it(
    gateway_factory, upstream, tmp_path
):
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    gw = gateway_factory(plain(upstream, "workers: 2\n"), env=env)
    assert gw.proc is not None
    files = []

    def written() -> bool:
        files[:] = list((runtime / "gateway").glob("limits-*.pid"))
        return bool(files)

    await wait_for(written)
    assert files[0].read_text() == f"{gw.proc.pid}\n"  # the master's pid
    # admin is off: reload signals the process through the pid file
    gw.write_config(plain(upstream, "workers: 2\nserver_tokens: off\n")(gw.port))
    done = cli("reload", "-c", str(gw.config_path), env=env)
    assert done.returncode == 0 and f"sent SIGHUP to pid {gw.proc.pid}" in done.stdout
    await wait_for(lambda: "reconfiguring: signalling 2 workers" in gw.stderr())
    done = cli("reload", "--pid", str(files[0]))
    assert done.returncode == 0, done.stderr
    stopped = cli("stop", "--pid", str(files[0]))
    assert stopped.returncode == 0, stopped.stderr
    assert gw.proc.wait(5) == 0
    assert not files[0].exists()


def test_pid_off_writes_nothing_and_stop_says_so(tmp_path):
    conf = tmp_path / "off.yaml"
    conf.write_text("listen: 127.0.0.1:1\npid: off\nroutes:\n  - {location: /, return: {code: 204}}\n")
    done = cli("stop", "-c", str(conf))
    assert done.returncode == 1 and "pid is off; give --pid FILE" in done.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("listen: 127.0.0.1:1\npid: [1]\nroutes:\n  - {location: /, return: {code: 204}}\n")
    checked = cli("check", "-c", str(bad))
    assert (
        checked.returncode == 1
        and "bad.yaml" in checked.stderr
        and "pid: must be a file path, or off" in checked.stderr
    )


def test_stale_pid_file_is_reported_by_stop(tmp_path):
    pid_file = Path(tmp_path / "x.pid")
    pid_file.write_text(f"{dead_pid()}\n")
    done = cli("stop", "--pid", str(pid_file))
    assert done.returncode == 1 and "not a running gateway (stale)" in done.stderr
    assert os.path.exists(pid_file)


def test_a_configured_pid_file_in_a_directory_others_can_write_refuses_the_start(tmp_path, upstream):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    conf = tmp_path / "limits.yaml"
    conf.write_text(plain(upstream, f"pid: {shared}/gw.pid\nstate_dir: {tmp_path}/state\n")(free_port()))
    started = cli("run", "-c", str(conf), timeout=30)
    assert started.returncode == 1
    assert f"refusing to write the pid file in {shared}: others can write that directory" in started.stderr
    assert list(shared.iterdir()) == []
