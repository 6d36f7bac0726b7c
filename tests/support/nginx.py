"""nginx as a child process of the test run (the differential and interop tests' reference)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.support.ports import wait_port

__all__ = ["NginxProcess", "find_nginx", "single_worker_conf"]


def find_nginx() -> str | None:
    """The nginx binary on PATH or in the usual sbin directories; None when not installed."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


def single_worker_conf(workdir: Path, http: str, worker_connections: int = 1024) -> str:
    """An nginx.conf of one process in the foreground, its pid, error log and temp paths in
    ``workdir``, around the ``http`` block's body ``http``."""
    d = workdir
    return f"""daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections {worker_connections}; }}
http {{
    client_body_temp_path {d}/client_body_temp;
    proxy_temp_path {d}/proxy_temp;
    fastcgi_temp_path {d}/fastcgi_temp;
    uwsgi_temp_path {d}/uwsgi_temp;
    scgi_temp_path {d}/scgi_temp;
{http}
}}
"""


class NginxProcess:
    """The nginx binary as a child of the test run, with its prefix and error log in ``workdir``."""

    def __init__(self, binary: str, workdir: Path, conf_text: str, port: int) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = port
        self.conf_path = workdir / "nginx.conf"
        self.conf_path.write_text(conf_text)
        self.error_log = workdir / "error.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> NginxProcess:
        cmd = [self.binary, "-p", f"{self.workdir}/", "-c", str(self.conf_path), "-e", str(self.error_log)]
        check = subprocess.run([*cmd, "-t"], capture_output=True, text=True, timeout=30)
        if check.returncode != 0:
            raise RuntimeError(f"nginx -t failed:\n{check.stderr}\n{self.conf_path.read_text()}")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_port(self.port, timeout=10, proc=self.proc)
        except Exception as exc:
            self.stop()
            raise RuntimeError(f"nginx did not start: {exc}\n{self.errors()}") from None
        return self

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def errors(self) -> str:
        return self.error_log.read_text(errors="replace") if self.error_log.exists() else ""
