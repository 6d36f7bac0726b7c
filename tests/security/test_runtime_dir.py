"""A neighbour in a shared /tmp cannot keep the admin API from starting, nor take its token.

Without ``XDG_RUNTIME_DIR`` the runtime directory (pid file, generated admin token) is
``$TMPDIR/gateway-<uid>``, a name anyone can create first. The gateway creates it mode 0700;
one that is there already and is not ours (another owner, a symbolic link, a file, writable by
others) is never used: the gateway falls back to ``$XDG_STATE_HOME/gateway/run``, says so in the
error log, and the CLI finds the token and the pid file there.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import aiohttp
import pytest

from gateway.config import paths
from tests.support.gateway import cli
from tests.support.ports import free_port, wait_port
from tests.support.upstreams import Upstream


def config(upstream: Upstream, admin: int) -> object:
    def build(port: int) -> str:
        return f"""
listen: 127.0.0.1:{port}
admin: {{listen: 127.0.0.1:{admin}}}
upstreams:
  app: {{servers: [{upstream.address}]}}
routes:
  - {{location: /, upstream: app}}
"""

    return build


def environment(tmp_path: Path) -> dict[str, str]:
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    tmp.chmod(0o1777)  # a shared /tmp
    return {"XDG_RUNTIME_DIR": "", "TMPDIR": str(tmp), "XDG_STATE_HOME": str(tmp_path / "state")}


async def admin_status(admin: int, token: str) -> int:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{admin}/status", headers={"Authorization": f"Bearer {token}"}) as r:
            return r.status


def plant(kind: str, path: Path, tmp_path: Path) -> None:
    if kind == "foreign owner":
        if os.getuid() != 0:
            pytest.skip("making a directory another user owns needs root")
        path.mkdir(mode=0o700)
        os.chown(path, 65534, 65534)
    elif kind == "symlink":
        target = tmp_path / "attacker-chosen"
        target.mkdir(mode=0o700)
        path.symlink_to(target)
    elif kind == "file":
        path.write_text("in the way\n")
    elif kind == "world-writable":
        path.mkdir()
        path.chmod(0o777)


@pytest.mark.parametrize("kind", ["foreign owner", "symlink", "file", "world-writable"])
async def test_a_planted_runtime_directory_sends_the_gateway_to_a_private_one(
    gateway_factory, upstream, tmp_path, kind
):
    env = environment(tmp_path)
    planted = Path(env["TMPDIR"]) / f"gateway-{os.getuid()}"
    plant(kind, planted, tmp_path)
    admin = free_port()
    gw = gateway_factory(config(upstream, admin), env=env)
    wait_port(admin)
    fallback = tmp_path / "state" / "gateway" / "run"
    assert f"runtime directory: {planted} " in gw.stderr()
    assert f"not using it; using {fallback} instead" in gw.stderr()
    st = fallback.lstat()
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
    token_file = fallback / f"admin-{admin}.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert await admin_status(admin, token_file.read_text().strip()) == 200
    # the CLI resolves the same directory: the token, the admin API, the pid file
    shown = cli("token", "-c", str(gw.config_path), env=env, timeout=20)
    assert (shown.returncode, shown.stdout) == (0, f"{token_file}\n"), shown.stderr
    listed = cli("bans", "-c", str(gw.config_path), env=env, timeout=20)
    assert (listed.returncode, listed.stdout) == (0, "no bans in force\n"), listed.stderr
    assert list(fallback.glob("limits-*.pid"))
    stopped = cli("stop", "-c", str(gw.config_path), env=env, timeout=30)
    assert stopped.returncode == 0, stopped.stderr
    if kind == "symlink":
        assert list((tmp_path / "attacker-chosen").iterdir()) == []  # nothing written through the link


async def test_without_a_plant_the_runtime_directory_is_created_ours_and_0700(gateway_factory, upstream, tmp_path):
    env = environment(tmp_path)
    admin = free_port()
    gw = gateway_factory(config(upstream, admin), env=env)
    wait_port(admin)
    directory = Path(env["TMPDIR"]) / f"gateway-{os.getuid()}"
    st = directory.lstat()
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
    assert (directory / f"admin-{admin}.token").exists()
    assert "runtime directory" not in gw.stderr()
    assert not (tmp_path / "state").exists()


def test_runtime_dir_names_the_fallback_and_why(tmp_path, monkeypatch):
    env = environment(tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    primary = Path(env["TMPDIR"]) / f"gateway-{os.getuid()}"
    assert paths.runtime_dir() == paths.RuntimeDir(str(primary))
    primary.mkdir(mode=0o700)
    assert paths.runtime_dir() == paths.RuntimeDir(str(primary))
    primary.chmod(0o770)
    moved = paths.runtime_dir()
    assert moved.path == str(tmp_path / "state" / "gateway" / "run")
    assert moved.fallback_reason == f"{primary} is writable by group or others (mode 0770)"
