"""The generated admin token outlives the gateway: a restart keeps it, so a scraper's
``credentials_file`` and the status page's session stay valid; deleting the file or
``gateway token --rotate`` replaces it, and a running gateway follows a rotation at once.
``gateway token`` says where it is, and ``--show`` prints it."""

from __future__ import annotations

import stat
from pathlib import Path

import aiohttp

from tests.support.gateway import Gateway, cli
from tests.support.ports import free_port, wait_port
from tests.support.upstreams import Upstream


def config(upstream: Upstream, admin: int, admin_extra: str = "") -> object:
    def build(port: int) -> str:
        return f"""
listen: 127.0.0.1:{port}
admin: {{listen: 127.0.0.1:{admin}{admin_extra}}}
upstreams:
  app: {{servers: [{upstream.address}]}}
routes:
  - {{location: /, upstream: app}}
"""

    return build


async def status_with(admin: int, token: str) -> int:
    async with aiohttp.ClientSession() as session:
        async with session.get(
            f"http://127.0.0.1:{admin}/status", headers={"Authorization": f"Bearer {token}"}
        ) as resp:
            return resp.status


def restart(gw: Gateway, admin: int) -> None:
    assert gw.stop() == 0
    gw.start()
    wait_port(admin)


def token_cli(gw: Gateway, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    done = cli("token", *args, "-c", str(gw.config_path), env=env, timeout=20)
    return done.returncode, done.stdout, done.stderr


async def test_the_token_persists_across_restarts_until_rotated_or_deleted(gateway_factory, upstream, tmp_path):
    admin = free_port()
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    gw = gateway_factory(config(upstream, admin), env=env)
    wait_port(admin)
    token_file = runtime / "gateway" / f"admin-{admin}.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
    # `gateway token`: where it is; --show: the token
    assert token_cli(gw, env) == (0, f"{token_file}\n", "")
    code, shown, _ = token_cli(gw, env, "--show")
    first = token_file.read_text().strip()
    assert (code, shown) == (0, first + "\n")
    assert await status_with(admin, first) == 200
    # a restart keeps it, and says so
    restart(gw, admin)
    assert token_file.read_text().strip() == first
    assert await status_with(admin, first) == 200
    assert "admin API token (kept from before)" in gw.stderr()
    # --rotate: a new token; the running gateway takes it at its next call, the old one stops working
    code, rotated, err = token_cli(gw, env, "--rotate", "--show")
    second = rotated.strip()
    assert code == 0 and second != first and "new admin token in" in err
    assert token_file.read_text().strip() == second
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert await status_with(admin, first) == 401
    assert await status_with(admin, second) == 200
    restart(gw, admin)
    assert await status_with(admin, second) == 200
    # deleted: the next start makes a new one
    token_file.unlink()
    restart(gw, admin)
    third = token_file.read_text().strip()
    assert third not in (first, second) and len(third) >= 40
    assert await status_with(admin, third) == 200 and await status_with(admin, second) == 401


async def test_a_token_file_others_can_write_is_replaced_at_start(gateway_factory, upstream, tmp_path):
    admin = free_port()
    runtime = tmp_path / "runtime"
    (runtime / "gateway").mkdir(mode=0o700, parents=True)
    token_file = runtime / "gateway" / f"admin-{admin}.token"
    token_file.write_text("planted-token-0123456789\n")
    token_file.chmod(0o666)
    gateway_factory(config(upstream, admin), env={"XDG_RUNTIME_DIR": str(runtime)})
    wait_port(admin)
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()
    assert token != "planted-token-0123456789"
    assert await status_with(admin, "planted-token-0123456789") == 401
    assert await status_with(admin, token) == 200


def test_gateway_token_with_a_configured_token_or_the_admin_api_off(tmp_path):
    conf = tmp_path / "limits.yaml"
    base = (
        "listen: 127.0.0.1:1\nupstreams:\n  app: {servers: [127.0.0.1:9]}\nroutes:\n  - {location: /, upstream: app}\n"
    )
    conf.write_text(base + "admin: {listen: 127.0.0.1:9181, token: configured-s3cret}\n")
    done = cli("token", "-c", str(conf))
    assert done.returncode == 0 and "admin.token in" in done.stdout and "configured-s3cret" not in done.stdout
    done = cli("token", "--show", "-c", str(conf))
    assert (done.returncode, done.stdout) == (0, "configured-s3cret\n")
    done = cli("token", "--rotate", "-c", str(conf))
    assert done.returncode == 1 and "change it there" in done.stderr
    conf.write_text(base + "admin: {listen: off}\n")
    done = cli("token", "-c", str(conf))
    assert done.returncode == 1 and "the admin API is off" in done.stderr


def test_gateway_token_before_any_start_says_how_to_get_one(tmp_path):
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    conf = tmp_path / "limits.yaml"
    conf.write_text(
        "listen: 127.0.0.1:1\nadmin: {listen: 127.0.0.1:9182}\n"
        "upstreams:\n  app: {servers: [127.0.0.1:9]}\nroutes:\n  - {location: /, upstream: app}\n"
    )
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    done = cli("token", "-c", str(conf), env=env)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "gateway token --rotate" in done.stderr
    done = cli("token", "--rotate", "-c", str(conf), env=env)
    assert done.returncode == 0 and done.stdout == f"{Path(runtime) / 'gateway' / 'admin-9182.token'}\n"
