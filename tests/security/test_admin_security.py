"""The admin API as an attacker sees it: a web page in the operator's browser, a DNS-rebinding
domain, a neighbour in a shared /tmp, a fat-fingered ban, broken bytes, a dead Redis.

Every gateway here is the real one, started through its CLI; the token file goes to a
per-test ``XDG_RUNTIME_DIR`` (or ``TMPDIR``) so tests never share it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import stat
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.admin import token as admin_token
from tests.support.config import config
from tests.support.gateway import cli as _cli
from tests.support.ports import free_port
from tests.support.upstreams import Upstream

cli = functools.partial(_cli, timeout=20)  # a hung CLI fails these tests after 20 s

TOKEN = "s3cret"
ROUTES = "upstreams:\n  app: {servers: [127.0.0.1:9]}\nroutes:\n  - {location: /, upstream: app}\n"
JSON = {"Content-Type": "application/json"}


def gateway_config(upstream: Upstream, admin_port: int, admin_extra: str = "", extra: str = "") -> Any:
    return config(upstream, admin=f"{{listen: 127.0.0.1:{admin_port}{admin_extra}}}", extra=extra)


def runtime_env(tmp_path: Path) -> dict[str, str]:
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    return {"XDG_RUNTIME_DIR": str(runtime)}


async def call(
    method: str, url: str, *, headers: dict[str, str] | None = None, data: str | None = None
) -> tuple[int, dict[str, str], str]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        async with session.request(method, url, headers=headers, data=data) as resp:
            return resp.status, dict(resp.headers), await resp.text()


async def raw(port: int, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
    """Send bytes as they are (no client library cleaning them up); the status and the body."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    writer.write(head.rstrip(b"\r\n") + b"\r\nConnection: close\r\n\r\n" + body)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    status = int(data.split(b" ", 2)[1])
    return status, data.partition(b"\r\n\r\n")[2]


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def wait_for_file(path: Path, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        await asyncio.sleep(0.02)


# -- 1 and 2: the token, generated when none is configured ------------------------------------------


async def test_without_a_configured_token_every_call_needs_the_generated_one(gateway_factory, upstream, tmp_path):
    admin = free_port()
    env = runtime_env(tmp_path)
    gw = gateway_factory(gateway_config(upstream, admin), env=env)
    token_file = Path(env["XDG_RUNTIME_DIR"]) / "gateway" / f"admin-{admin}.token"
    await wait_for_file(token_file)
    assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()
    assert len(token) >= 40
    base = f"http://127.0.0.1:{admin}"
    # No token, a wrong one, an empty one, another scheme: 401 on everything but the probes.
    for headers in ({}, auth("s3cret"), auth(""), {"Authorization": f"Basic {token}"}, {"Authorization": token}):
        for method, path in (
            ("GET", "/status"),
            ("GET", "/bans"),
            ("POST", "/bans"),
            ("DELETE", "/bans/10.0.0.1"),
            ("POST", "/reload"),
            ("GET", "/config"),
            ("GET", "/zones/one/127.0.0.1"),
            ("DELETE", "/zones/one/127.0.0.1"),
            ("GET", "/nothing-here"),
            ("GET", "/healthz/../status"),
        ):
            got, _, body = await call(method, base + path, headers={**JSON, **headers}, data="{}")
            assert got == 401, (method, path, headers, body)
            assert "error" in json.loads(body)
    assert (await call("GET", base + "/healthz"))[0] == 200
    got, _, body = await call("GET", base + "/readyz")
    assert (got, json.loads(body)) == (200, {"ready": True})
    got, _, body = await call("GET", base + "/status", headers=auth(token))
    assert got == 200 and json.loads(body)["store"] == "memory"
    # The CLI finds the token by itself: no setup.
    banned = cli("ban", "192.0.2.7", "--reason", "test", "-c", str(gw.config_path), env=env)
    assert banned.returncode == 0, banned.stderr
    listed = cli("bans", "--json", "-c", str(gw.config_path), env=env)
    assert [b["target"] for b in json.loads(listed.stdout)] == ["192.0.2.7/32"]
    assert cli("reload", "-c", str(gw.config_path), env=env).stdout == "reloaded\n"
    assert gw.stop() == 0
    assert token_file.read_text().strip() == token  # kept for the next start
    # With the gateway gone, the CLI says so in one line.
    gone = cli("bans", "-c", str(gw.config_path), env=env)
    assert gone.returncode == 1 and gone.stderr.count("\n") == 1
    assert gone.stderr.startswith("gateway: cannot reach the admin API")
    token_file.unlink()
    gone = cli("bans", "-c", str(gw.config_path), env=env)
    assert gone.returncode == 1 and gone.stderr.count("\n") == 1
    assert gone.stderr.startswith("gateway: no admin token: admin.token is not set")


async def test_without_xdg_runtime_dir_the_token_goes_to_a_private_dir_in_tmp(gateway_factory, upstream, tmp_path):
    admin = free_port()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {"XDG_RUNTIME_DIR": "", "TMPDIR": str(tmp)}
    gw = gateway_factory(gateway_config(upstream, admin), env=env)
    token_file = tmp / f"gateway-{os.getuid()}" / f"admin-{admin}.token"
    await wait_for_file(token_file)
    assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
    done = cli("bans", "-c", str(gw.config_path), env=env)
    assert (done.returncode, done.stdout) == (0, "no bans in force\n"), done.stderr
    gw.stop()
    assert token_file.exists()


async def test_the_master_of_several_workers_generates_and_keeps_the_token(gateway_factory, upstream, tmp_path):
    admin = free_port()
    env = runtime_env(tmp_path)
    gw = gateway_factory(gateway_config(upstream, admin, extra="workers: 2\n"), env=env)
    token_file = Path(env["XDG_RUNTIME_DIR"]) / "gateway" / f"admin-{admin}.token"
    await wait_for_file(token_file)
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert (await call("GET", f"http://127.0.0.1:{admin}/bans"))[0] == 401
    done = cli("ban", "192.0.2.8", "-c", str(gw.config_path), env=env)
    assert done.returncode == 0, done.stderr
    assert gw.stop() == 0
    assert token_file.exists()


async def test_a_configured_token_is_used_and_no_file_is_written(gateway_factory, upstream, tmp_path):
    admin = free_port()
    env = runtime_env(tmp_path)
    gw = gateway_factory(gateway_config(upstream, admin, f", token: {TOKEN}"), env=env)
    base = f"http://127.0.0.1:{admin}"
    assert (await call("GET", base + "/status", headers=auth()))[0] == 200
    assert (await call("GET", base + "/status", headers=auth(TOKEN + "x")))[0] == 401
    assert (await call("GET", base + "/status", headers={"Authorization": f"bearer  {TOKEN} "}))[0] == 200
    assert not list((Path(env["XDG_RUNTIME_DIR"]) / "gateway").glob("admin-*"))  # (the pid file is there)
    assert cli("bans", "-c", str(gw.config_path), env=env).returncode == 0


# -- the token file against a hostile shared directory ------------------------------------------------


async def test_a_runtime_directory_others_can_write_is_not_used_the_gateway_falls_back(
    gateway_factory, upstream, tmp_path
):
    admin = free_port()
    env = runtime_env(tmp_path)
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    planted = Path(env["XDG_RUNTIME_DIR"]) / "gateway"
    planted.mkdir()
    planted.chmod(0o777)  # what a neighbour would leave in a shared /tmp
    gw = gateway_factory(gateway_config(upstream, admin), env=env)
    assert (await call("GET", gw.url + "/echo"))[0] == 200  # the proxy serves
    assert "writable by group or others" in gw.stderr() and "using " in gw.stderr()
    assert list(planted.iterdir()) == []  # no token file, and no pid file either
    fallback = tmp_path / "state" / "gateway" / "run"
    token = (fallback / f"admin-{admin}.token").read_text().strip()
    assert stat.S_IMODE(fallback.stat().st_mode) == 0o700
    assert (await call("GET", f"http://127.0.0.1:{admin}/status", headers=auth(token)))[0] == 200
    listed = cli("bans", "-c", str(gw.config_path), env=env)  # the CLI resolves the same fallback
    assert (listed.returncode, listed.stdout) == (0, "no bans in force\n"), listed.stderr


def test_publish_refuses_a_directory_owned_by_someone_else_or_a_symlink(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    if os.getuid() == 0:
        os.chown(foreign, 65534, 65534)
        with pytest.raises(admin_token.TokenFileError, match="owned by uid 65534, not by this user"):
            admin_token.publish(str(foreign / "admin.token"), "t0ken")
        with pytest.raises(admin_token.TokenFileError, match="owned by uid 65534"):
            admin_token.read(str(foreign / "admin.token"))
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(ours)
    with pytest.raises(admin_token.TokenFileError, match="symbolic link or not a directory"):
        admin_token.publish(str(link / "admin.token"), "t0ken")
    assert list(ours.iterdir()) == []


def test_publish_replaces_a_planted_symlink_instead_of_writing_through_it(tmp_path):
    directory = tmp_path / "gateway"
    directory.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    path = directory / "admin-9180.token"
    path.symlink_to(victim)
    with pytest.raises(admin_token.TokenFileError):
        admin_token.read(str(path))  # the CLI does not follow it either
    admin_token.publish(str(path), "t0ken")
    assert victim.read_text() == "precious\n"
    assert not path.is_symlink() and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert admin_token.read(str(path)) == "t0ken"
    assert sorted(p.name for p in directory.iterdir()) == ["admin-9180.token"]  # no temp file left


def test_read_refuses_a_token_file_others_can_write(tmp_path):
    directory = tmp_path / "gateway"
    directory.mkdir(mode=0o700)
    path = directory / "admin.token"
    admin_token.publish(str(path), "t0ken")
    path.chmod(0o666)
    with pytest.raises(admin_token.TokenFileError, match="writable by group or others"):
        admin_token.read(str(path))


# -- 3: a non-loopback admin.listen needs a token -------------------------------------------------


@pytest.mark.parametrize(
    ("listen", "ok"),
    [
        ("0.0.0.0:9180", False),
        ("'[::]:9180'", False),
        ("9180", False),
        ("192.0.2.1:9180", False),
        ("admin.example:9180", False),
        ("127.0.0.1:9180", True),
        ("127.3.2.1:9180", True),
        ("'[::1]:9180'", True),
        ("localhost:9180", True),
    ],
)
def test_check_refuses_a_non_loopback_admin_listen_without_a_token(tmp_path, listen, ok):
    conf = tmp_path / "limits.yaml"
    conf.write_text(f"listen: 127.0.0.1:8080\nadmin:\n  listen: {listen}\n{ROUTES}")
    checked = cli("check", "-c", str(conf))
    if ok:
        assert checked.returncode == 0, checked.stderr
        return
    assert checked.returncode == 1
    assert checked.stderr.startswith(f"gateway: {conf}:3:") and " admin.listen: " in checked.stderr
    assert "is not a loopback address: an admin API reachable from other machines needs admin.token" in checked.stderr
    conf.write_text(conf.read_text().replace("admin:\n", f"admin:\n  token: {TOKEN}\n"))
    assert cli("check", "-c", str(conf)).returncode == 0


def test_run_refuses_a_non_loopback_admin_listen_without_a_token(tmp_path):
    conf = tmp_path / "limits.yaml"
    conf.write_text(f"listen: 127.0.0.1:{free_port()}\nadmin: {{listen: 0.0.0.0:{free_port()}}}\n{ROUTES}")
    started = cli("run", "-c", str(conf), timeout=20)
    assert started.returncode == 1 and "needs admin.token" in started.stderr


def test_check_refuses_tokens_that_cannot_work(tmp_path):
    conf = tmp_path / "limits.yaml"
    for admin, message in (
        ("{token: 'two words'}", "admin.token: the token must be visible ASCII characters, without spaces"),
        ("{token: ''}", "admin.token: expected a non-empty string"),
        ('{token: "t\\u00e9st"}', "admin.token: the token must be visible ASCII characters, without spaces"),
        ("{token_file: relative/admin.token}", "admin.token_file: must be an absolute path"),
    ):
        conf.write_text(f"admin: {admin}\n{ROUTES}")
        checked = cli("check", "-c", str(conf))
        assert checked.returncode == 1 and message in checked.stderr, checked.stderr


# -- 4: what a web page can make a browser send ------------------------------------------------------


async def test_browser_driven_requests_are_refused_even_with_the_token(gateway_factory, upstream):
    admin = free_port()
    gateway_factory(gateway_config(upstream, admin, f", token: {TOKEN}"))
    base = f"http://127.0.0.1:{admin}"
    body = json.dumps({"target": "192.0.2.50"})
    # The "simple" cross-origin POST a page can send without a preflight.
    for headers in (
        {"Content-Type": "text/plain", "Origin": "http://evil.example"},
        {"Content-Type": "text/plain", "Origin": "http://evil.example", **auth()},
        {"Content-Type": "text/plain"},
        {"Content-Type": "text/plain", **auth()},
        {"Content-Type": "application/x-www-form-urlencoded", **auth()},
        {"Content-Type": "multipart/form-data; boundary=x", **auth()},
        {"Content-Type": "application/json-seq", **auth()},
        {**auth()},
    ):
        got, resp_headers, text = await call("POST", base + "/bans", headers=headers, data=body)
        assert got in (403, 415), headers
        assert got == (403 if "Origin" in headers else 415)
        assert "error" in json.loads(text)
        assert not any(h.lower().startswith("access-control-") for h in resp_headers)
    assert (await call("DELETE", base + "/bans/192.0.2.50", headers=auth()))[0] == 415
    # Cross-origin with JSON (which would need a preflight) and odd origins.
    for origin in (
        "http://evil.example",
        "null",
        f"http://127.0.0.1:{admin + 1}",
        f"https://127.0.0.1:{admin}",
        f"http://127.0.0.1.evil.example:{admin}",
        f"http://localhost:{admin}.evil.example",
    ):
        got, _, _ = await call("POST", base + "/bans", headers={**JSON, **auth(), "Origin": origin}, data=body)
        assert got == 403, origin
    # Preflights are never answered, and never with CORS headers.
    got, resp_headers, _ = await call(
        "OPTIONS",
        base + "/bans",
        headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert got == 403 and not any(h.lower().startswith("access-control-") for h in resp_headers)
    assert (await call("OPTIONS", base + "/bans", headers=auth()))[0] == 403
    got, _, _ = await call("GET", base + "/status", headers={**auth(), "Sec-Fetch-Site": "cross-site"})
    assert got == 403
    # Nothing was banned by any of that.
    got, _, text = await call("GET", base + "/bans", headers=auth())
    assert (got, json.loads(text)) == (200, [])
    # The listener's own origin is fine.
    for origin in (f"http://127.0.0.1:{admin}", f"http://localhost:{admin}"):
        got, _, _ = await call("GET", base + "/bans", headers={**auth(), "Origin": origin})
        assert got == 200, origin


async def test_dns_rebinding_hosts_are_refused_on_a_loopback_listener(gateway_factory, upstream):
    admin = free_port()
    gateway_factory(gateway_config(upstream, admin, f", token: {TOKEN}"))
    base = f"http://127.0.0.1:{admin}"
    for host in (
        "evil.example",
        f"evil.example:{admin}",
        f"127.0.0.1.evil.example:{admin}",
        "localhost.evil.example",
        f"localhost:{admin}@evil.example",
        "127.0.0.1:abc",
        "[::1",
        "10.0.0.1",
        "0.0.0.0",
        "",
    ):
        for path, headers in (("/healthz", {}), ("/status", auth())):
            got, _, _ = await call("GET", base + path, headers={**headers, "Host": host})
            assert got in (400, 403), (host, path, got)
    for host in ("localhost", f"localhost:{admin}", "127.0.0.1", f"127.9.8.7:{admin}", "[::1]", f"[::1]:{admin}"):
        got, _, _ = await call("GET", base + "/status", headers={**auth(), "Host": host})
        assert got == 200, host


# -- 5: bans that would lock everyone out ------------------------------------------------------------

TRUSTING = """
real_ip: {from: [10.20.0.0/16], header: X-Forwarded-For}
access: {allow: [198.51.100.10]}
"""


async def test_sweeping_bans_need_force(gateway_factory, upstream, tmp_path):
    admin = free_port()
    env = runtime_env(tmp_path)
    gw = gateway_factory(gateway_config(upstream, admin, f", token: {TOKEN}", TRUSTING), env=env)
    base = f"http://127.0.0.1:{admin}"
    refused = {
        "0.0.0.0/0": "0.0.0.0/0 is wider than /16",
        "10.0.0.0/15": "10.0.0.0/15 is wider than /16",
        "::/0": "::/0 is wider than /48",
        "2001:db8::/47": "2001:db8::/47 is wider than /48",
        "10.20.3.4": "10.20.3.4/32 covers 10.20.0.0/16 in real_ip.from",
        "10.20.0.0/16": "10.20.0.0/16 covers 10.20.0.0/16 in real_ip.from",
        "198.51.100.0/24": "198.51.100.0/24 covers 198.51.100.10/32 in access.allow",
    }
    for target, reason in refused.items():
        for force in ({}, {"force": False}):
            got, _, text = await call(
                "POST", base + "/bans", headers={**JSON, **auth()}, data=json.dumps({"target": target, **force})
            )
            assert got == 409, target
            assert json.loads(text)["reason"] == reason
    got, _, text = await call(
        "POST", base + "/bans", headers={**JSON, **auth()}, data=json.dumps({"target": "0.0.0.0/0", "force": "yes"})
    )
    assert got == 400
    assert (await call("GET", gw.url + "/echo"))[0] == 200  # nobody was locked out
    for target in ("10.0.0.0/16", "2001:db8::/48", "192.0.2.1"):
        got, _, _ = await call("POST", base + "/bans", headers={**JSON, **auth()}, data=json.dumps({"target": target}))
        assert got == 201, target
    # The CLI: same check, one line, --force to override.
    conf = str(gw.config_path)
    no = cli("ban", "0.0.0.0/0", "-c", conf, env=env)
    assert (no.returncode, no.stderr) == (
        1,
        "gateway: ban refused: 0.0.0.0/0 is wider than /16; add --force to ban anyway\n",
    )
    yes = cli("ban", "10.20.3.4", "--force", "--for", "1m", "-c", conf, env=env)
    assert yes.returncode == 0, yes.stderr
    listed = {b["target"] for b in json.loads(cli("bans", "--json", "-c", conf, env=env).stdout)}
    assert listed == {"10.0.0.0/16", "2001:db8::/48", "192.0.2.1/32", "10.20.3.4/32"}


def test_the_cli_checks_a_ban_before_writing_it_to_redis(redis_server, tmp_path):
    conf = tmp_path / "limits.yaml"
    conf.write_text(
        f"""
store: {{redis: {{url: "{redis_server.url}", prefix: "sec:"}}}}
{TRUSTING}
{ROUTES}"""
    )
    for target in ("0.0.0.0/0", "10.20.0.7", "::/16"):
        no = cli("ban", target, "-c", str(conf))
        assert no.returncode == 1 and no.stderr.count("\n") == 1 and "add --force" in no.stderr
    assert redis_server.command("HLEN", "sec:gateway:bans") == 0
    assert cli("ban", "10.20.0.7", "--force", "-c", str(conf)).returncode == 0
    assert redis_server.command("HKEYS", "sec:gateway:bans") == ["10.20.0.7/32"]


# -- 6: broken bytes, and Redis gone ----------------------------------------------------------------


async def test_malformed_headers_and_bodies_get_4xx_never_500(gateway_factory, upstream):
    admin = free_port()
    gw = gateway_factory(gateway_config(upstream, admin, f", token: {TOKEN}"))
    host = f"Host: 127.0.0.1:{admin}\r\n".encode()
    for header in (
        b"Authorization: Bearer \xff\xfe\xfd",
        b"Authorization: \xc3\x28 s3cret",
        b"Authorization: Bearer s3cret\xff",
        b"Authorization: Bearer",
        b"Authorization: Bearer s3cret\r\nAuthorization: Bearer s3cret",
        b"Authorization: Digest s3cret",
    ):
        got, body = await raw(admin, b"GET /status HTTP/1.1\r\n" + host + header)
        assert got == 401, header
        assert "error" in json.loads(body)
    for header in (b"Origin: http://\xff.example", b"Sec-Fetch-Site: \xff"):
        got, body = await raw(admin, b"GET /status HTTP/1.1\r\n" + host + header + b"\r\nAuthorization: Bearer s3cret")
        assert got in (200, 403), header
    got, _ = await raw(admin, b"GET /status HTTP/1.1\r\nHost: \xff\xfe\r\nAuthorization: Bearer s3cret")
    assert got in (400, 403)
    post = b"POST /bans HTTP/1.1\r\n" + host + b"Authorization: Bearer s3cret\r\nContent-Type: application/json\r\n"
    hostile = b"<script>alert(1)</script>"
    for body in (
        b'{"target": "\xff\xfe"}',
        b"[1, 2]",
        b"not json",
        b'{"target": "' + hostile + b'"}',
        b'{"target": "192.0.2.1", "for": "' + hostile + b'"}',
        b'{"target": 17}',
        b'{"target": "192.0.2.1", "force": 1}',
    ):
        got, answer = await raw(admin, post + f"Content-Length: {len(body)}".encode(), body)
        assert got == 400, body
        assert hostile not in answer and b"\xff" not in answer  # nothing of the request echoed
    got, answer = await raw(
        admin,
        b"DELETE /bans/" + hostile + b" HTTP/1.1\r\n" + host + b"Authorization: Bearer s3cret\r\n"
        b"Content-Type: application/json",
    )
    assert got == 400 and hostile not in answer
    assert "Traceback" not in gw.stderr()


def redis_config(upstream: Upstream, admin_port: int, redis_url: str) -> Any:
    return gateway_config(
        upstream,
        admin_port,
        f", token: {TOKEN}",
        f'store: {{redis: {{url: "{redis_url}", timeout: 200ms, prefix: "adm:"}}}}\n',
    )


@pytest.mark.timing
async def test_a_redis_outage_gives_503_in_bounded_time_and_one_line_from_the_cli(
    gateway_factory, upstream, redis_server
):
    admin = free_port()
    gw = gateway_factory(redis_config(upstream, admin, redis_server.url))
    base = f"http://127.0.0.1:{admin}"
    got, _, text = await call("GET", base + "/readyz")
    assert (got, json.loads(text)) == (200, {"ready": True, "redis": "up", "on_error": "local"})
    conf = str(gw.config_path)
    for outage in ("stopped", "frozen"):
        if outage == "stopped":
            redis_server.stop()
        else:
            redis_server.restart()
            redis_server.pause()  # SIGSTOP: connections hang instead of being refused
        try:
            for method, path, body in (
                ("GET", "/bans", None),
                ("POST", "/bans", json.dumps({"target": "192.0.2.1"})),
                ("DELETE", "/bans/192.0.2.1", "{}"),
            ):
                started = time.monotonic()
                got, _, text = await call(method, base + path, headers={**JSON, **auth()}, data=body)
                assert got == 503, (outage, method, path, text)
                assert "Redis" in json.loads(text)["error"]
                assert time.monotonic() - started < 3.5
            started = time.monotonic()
            got, _, text = await call("GET", base + "/readyz")
            # on_error: local serves on: ready, with Redis reported down
            assert got == 200 and json.loads(text)["redis"] == "down" and "Redis" in json.loads(text)["reason"]
            assert time.monotonic() - started < 2.0
            for args in (("ban", "192.0.2.1"), ("unban", "192.0.2.1"), ("bans",)):
                started = time.monotonic()
                done = cli(*args, "-c", conf)
                assert done.returncode == 1, (outage, args)
                assert done.stderr.count("\n") == 1 and done.stderr.startswith("gateway: cannot reach Redis")
                assert time.monotonic() - started < 10
        finally:
            if outage == "frozen":
                redis_server.resume()
    assert "Traceback" not in gw.stderr()
    got, _, _ = await call("GET", base + "/bans", headers=auth())
    assert got == 200  # and it recovers


async def test_the_cli_fails_in_one_line_when_the_admin_api_is_unreachable_or_refuses(tmp_path, upstream):
    conf = tmp_path / "limits.yaml"
    conf.write_text(f"admin: {{listen: 127.0.0.1:{free_port()}, token: {TOKEN}}}\n{ROUTES}")
    for args in (("reload",), ("ban", "192.0.2.1"), ("unban", "192.0.2.1"), ("bans",)):
        done = cli(*args, "-c", str(conf))
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith("gateway: cannot reach the admin API at 127.0.0.1:")


async def test_the_cli_reports_a_wrong_token_in_one_line(gateway_factory, upstream, tmp_path):
    admin = free_port()
    gw = gateway_factory(gateway_config(upstream, admin, f", token: {TOKEN}"))
    other = tmp_path / "other.yaml"
    other.write_text(gw.config_path.read_text().replace(TOKEN, "not-it"))
    done = cli("bans", "-c", str(other))
    assert (done.returncode, done.stderr) == (1, "gateway: admin API answered 401: wrong admin token\n")


async def test_readyz_is_not_ready_while_shutting_down(gateway_factory, upstream):
    admin = free_port()
    gw = gateway_factory(gateway_config(upstream, admin, f", token: {TOKEN}", "shutdown_timeout: 5s\n"))
    arrived = threading.Event()

    async def hold(request: Any) -> None:
        arrived.set()
        await asyncio.sleep(3)

    upstream.hooks["echo"] = hold
    async with aiohttp.ClientSession() as session:
        slow = asyncio.ensure_future(session.get(gw.url + "/echo"))
        assert await asyncio.to_thread(arrived.wait, 5)  # the request is in flight at the upstream
        gw.signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while True:
            got, _, text = await call("GET", f"http://127.0.0.1:{admin}/readyz")
            if got == 503:
                break
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert json.loads(text)["ready"] is False
        (await slow).release()
