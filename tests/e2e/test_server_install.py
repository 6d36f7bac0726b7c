"""The server install path in ``contrib/``, checked by the tools that will read it.

* ``contrib/systemd/gateway.service``: ``systemd-analyze verify`` (no running systemd needed:
  it checks every setting, and that the ``Exec*`` binaries exist, so a copy points them at
  this checkout's ``gateway``);
* ``contrib/logrotate/gateway``: ``logrotate`` rotates a running gateway's log files for real
  (paths and user moved into a scratch directory), and the gateway writes on in the new files
  after the reopen signal;
* ``LICENSE``: the Apache License 2.0 that ``pyproject.toml`` declares.
"""

from __future__ import annotations

import getpass
import grp
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

from tests.support.gateway import Gateway
from tests.support.paths import ROOT
from tests.support.ports import free_port

UNIT = ROOT / "contrib" / "systemd" / "gateway.service"
LOGROTATE = ROOT / "contrib" / "logrotate" / "gateway"
INSTALLED = "/opt/gateway/bin/gateway"


def unit_settings(text: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def systemd_analyze() -> str:
    binary = shutil.which("systemd-analyze")
    if binary is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd; scripts/test installs it)")
    return binary


def verify(binary: str, unit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60)


def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    binary = systemd_analyze()
    sanity = tmp_path / "sanity.service"
    sanity.write_text("[Service]\nExecStart=/bin/true\n")
    probe = verify(binary, sanity)
    if probe.returncode != 0:
        pytest.skip(f"systemd-analyze verify cannot run here: {(probe.stderr or probe.stdout).strip()[:300]}")
    gateway = ROOT / ".venv" / "bin" / "gateway"
    if not gateway.exists():
        gateway = Path(shutil.which("gateway") or sys.executable)
    text = UNIT.read_text()
    assert text.count(INSTALLED) == 2  # ExecStartPre= (gateway check) and ExecStart=
    copy = tmp_path / "gateway.service"
    copy.write_text(text.replace(INSTALLED, str(gateway)))
    result = verify(binary, copy)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_verify_would_catch_a_mistake(tmp_path: Path) -> None:
    """The check above means something: a misspelt setting is reported."""
    binary = systemd_analyze()
    copy = tmp_path / "gateway.service"
    copy.write_text(UNIT.read_text().replace(INSTALLED, "/bin/true").replace("ProtectSystem=", "ProtectSytem="))
    assert "Unknown key 'ProtectSytem'" in verify(binary, copy).stderr


def test_the_unit_says_what_the_install_path_promises() -> None:
    settings = unit_settings(UNIT.read_text())
    expected = {
        "Type": ["notify"],  # gateway/runtime/notify.py: READY=1, RELOADING=1, STOPPING=1
        "ExecReload": ["/bin/kill -HUP $MAINPID"],
        "User": ["gateway"],
        "RuntimeDirectory": ["gateway"],
        "StateDirectory": ["gateway"],
        "ProtectSystem": ["strict"],
        "ProtectHome": ["yes"],
        "PrivateTmp": ["yes"],
        "NoNewPrivileges": ["yes"],
        "CapabilityBoundingSet": [""],  # ports >= 1024; the comment says how to allow 80 and 443
        "RestrictAddressFamilies": ["AF_INET AF_INET6 AF_UNIX"],
        "SystemCallFilter": ["@system-service"],
        "KillMode": ["mixed"],  # SIGTERM to the master, which drains its workers
    }
    assert {key: settings.get(key) for key in expected} == expected
    assert int(settings["LimitNOFILE"][0]) >= 65536
    assert settings["ExecStart"] == [f"{INSTALLED} run -c /etc/gateway/limits.yaml"]


def find_logrotate() -> str:
    binary = shutil.which("logrotate") or next(
        (path for path in ("/usr/sbin/logrotate", "/sbin/logrotate") if os.access(path, os.X_OK)), None
    )
    if binary is None:
        pytest.skip("logrotate is not installed (Debian package logrotate; scripts/test installs it)")
    return binary


def get(url: str) -> None:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 204


def lines_of(path: Path, count: int, timeout: float = 10.0) -> list[str]:
    """The file's lines once it has ``count`` of them (the access log is flushed every 100 ms)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def test_logrotate_rotates_a_running_gateway_s_logs(tmp_path: Path) -> None:
    binary = find_logrotate()
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o755)
    pid = tmp_path / "gateway.pid"
    port = free_port()
    config = f"""
listen: 127.0.0.1:{port}
pid: {pid}
admin: {{listen: off}}
log:
  access: {logs}/access.log
  error: {logs}/error.log
  format: '$request_uri $status'
routes:
  - location: /
    return: {{code: 204}}
"""
    user, group = getpass.getuser(), grp.getgrgid(os.getgid()).gr_name
    text = LOGROTATE.read_text()
    for shipped in (
        "/var/log/gateway/*.log {",
        "/run/gateway/gateway.pid",
        "su gateway gateway",
        "0640 gateway gateway",
    ):
        assert shipped in text
    text = (
        text.replace("/var/log/gateway/", f"{logs}/")
        .replace("/run/gateway/gateway.pid", str(pid))
        .replace("gateway gateway", f"{user} {group}")
    )
    conf = tmp_path / "logrotate.conf"
    conf.write_text(text)
    state = tmp_path / "logrotate.state"

    dry = subprocess.run([binary, "-d", "-s", str(state), str(conf)], capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0 and "error:" not in dry.stdout + dry.stderr, dry.stdout + dry.stderr

    gateway = Gateway(tmp_path, config, port).start()
    try:
        assert pid.read_text().strip() == str(gateway.proc.pid if gateway.proc else 0)
        for n in range(3):
            get(f"http://127.0.0.1:{port}/before/{n}")
        assert lines_of(logs / "access.log", 3) == [f"/before/{n} 204" for n in range(3)]

        run = subprocess.run([binary, "-f", "-s", str(state), str(conf)], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stdout + run.stderr

        rotated = [p.name for p in logs.iterdir() if re.fullmatch(r"access\.log-\d{8}", p.name)]
        assert len(rotated) == 1, sorted(p.name for p in logs.iterdir())
        for n in range(2):
            get(f"http://127.0.0.1:{port}/after/{n}")
        assert lines_of(logs / "access.log", 2) == ["/after/0 204", "/after/1 204"]  # reopened on SIGUSR1
        assert (logs / rotated[0]).read_text().splitlines() == [f"/before/{n} 204" for n in range(3)]
        assert (logs / "access.log").stat().st_mode & 0o777 == 0o640  # logrotate's create, kept by the reopen
    finally:
        gateway.stop()


def test_the_license_is_the_apache_license_pyproject_declares() -> None:
    with (ROOT / "pyproject.toml").open("rb") as f:
        assert tomllib.load(f)["project"]["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n") or text.lstrip().startswith("Apache License")
    assert "Version 2.0, January 2004" in text
    assert "http://www.apache.org/licenses/" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert "APPENDIX: How to apply the Apache License to your work." in text
