"""The gateway as its users run it: ``python -m gateway run`` as a child process, and ``cli``.

Nothing here is mocked: the gateway is started through its real CLI with a YAML file
written to a temporary directory, and its stdout / stderr go to files the tests read.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.paths import ROOT
from tests.support.ports import wait_port

__all__ = ["ROOT", "Gateway", "cli", "temp_fds"]


class Gateway:
    """The gateway started through its CLI, with its output in files."""

    def __init__(
        self,
        workdir: Path,
        config_text: str,
        port: int,
        *,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.port = port
        self.config_path = workdir / "limits.yaml"
        self.config_path.write_text(config_text)
        self.stdout_path = workdir / "gateway.stdout"
        self.stderr_path = workdir / "gateway.stderr"
        self.extra_args = extra_args
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> Gateway:
        # A bound against a hang, not a measurement: a gateway that fails exits and is seen at once;
        # one that is slow to start (2,000 locations and two workers on a busy machine) gets the time.
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        if self.env:
            env.update(self.env)
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", "run", "-c", str(self.config_path), *self.extra_args],
                stdout=out,
                stderr=err,
                cwd=str(ROOT),
                env=env,
            )
        try:
            wait_port(self.port, timeout=timeout, proc=self.proc)
        except Exception:
            self.stop()
            raise RuntimeError(f"gateway did not start:\n{self.stderr()}") from None
        return self

    def write_config(self, text: str) -> None:
        self.config_path.write_text(text)

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def reload(self, settle: float = 0.5) -> None:
        self.signal(signal.SIGHUP)
        time.sleep(settle)

    def stop(self, timeout: float = 20.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def access_lines(self, wait: float = 0.3, until: Callable[[list[str]], bool] | None = None) -> list[str]:
        """The access log's lines. With ``until``, as soon as it holds for them (within 20 s: the log is
        flushed every 100 ms, later on a busy machine); without, after ``wait`` seconds."""
        if until is None:
            time.sleep(wait)
            return [line for line in self.stdout().splitlines() if line.strip()]
        deadline = time.monotonic() + 20
        while True:
            lines = [line for line in self.stdout().splitlines() if line.strip()]
            if until(lines) or time.monotonic() > deadline:
                return lines
            time.sleep(0.02)

    def access_json(self, wait: float = 0.3) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.access_lines(wait)]

    def worker_pids(self) -> list[int]:
        """The processes that said they listen (``] PID#0: listening on`` in the error log)."""
        return sorted({int(p) for p in re.findall(r"\] (\d+)#0: listening on", self.stderr())})

    async def wait_workers(self, count: int, timeout: float = 20.0) -> None:
        """Until ``count`` processes listen (the workers of a master, or the one process)."""
        deadline = time.monotonic() + timeout
        while len(self.worker_pids()) < count:
            assert time.monotonic() < deadline, self.stderr()
            await asyncio.sleep(0.05)

    def rss_peak_kb(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        raise RuntimeError("no VmHWM")


def cli(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``gateway ARGS...`` as an operator runs it, from the checkout; its output as text."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        input=stdin,
        env=full_env,
        timeout=timeout,
    )


def temp_fds(gw: Gateway, temp_dir: Path) -> list[str]:
    """The gateway's open files in ``temp_dir`` (anonymous temp files show as '(deleted)'); an fd
    closed between the listing and its readlink is skipped (it is no longer open)."""
    assert gw.proc is not None
    out = []
    fd_dir = Path(f"/proc/{gw.proc.pid}/fd")
    for entry in fd_dir.iterdir():
        try:
            target = os.readlink(entry)
        except FileNotFoundError:
            continue
        if target.startswith(str(temp_dir)):
            out.append(target)
    return out
