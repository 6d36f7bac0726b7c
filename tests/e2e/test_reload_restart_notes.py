"""A reload names, in its reply's ``notes`` and on ``gateway reload``'s output, every change that
only a restart applies; the settings it does apply get no note."""

from __future__ import annotations

import json

import aiohttp
import pytest

from tests.support.gateway import cli
from tests.support.ports import free_port
from tests.support.upstreams import Upstream

TOKEN = "s3cret-reload-notes"


def config(upstream: Upstream, port: int, admin: int, *, workers: int = 1, extra: str = "") -> str:
    return f"""
listen: 127.0.0.1:{port}
workers: {workers}
shutdown_timeout: 5s
admin: {{listen: 127.0.0.1:{admin}, token: {TOKEN}}}
upstreams:
  app: {{servers: [{upstream.address}]}}
routes:
  - {{location: /, upstream: app}}
{extra}"""


async def post_reload(admin: int) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"http://127.0.0.1:{admin}/reload",
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
            data="{}",
        ) as resp:
            return resp.status, json.loads(await resp.text())


async def test_gateway_reload_prints_that_metrics_listen_needs_a_restart(gateway_factory, upstream):
    admin = free_port()
    gw = gateway_factory(lambda port: config(upstream, port, admin))
    gw.write_config(config(upstream, gw.port, admin, extra=f"metrics: {{listen: 127.0.0.1:{free_port()}}}\n"))
    done = cli("reload", "-c", str(gw.config_path))
    assert (done.returncode, done.stdout) == (0, "reloaded\n"), done.stderr
    assert done.stderr == "gateway: note: metrics.listen changes take effect on restart, not on reload\n"
    # nothing changed: no note
    done = cli("reload", "-c", str(gw.config_path))
    assert (done.returncode, done.stdout, done.stderr) == (0, "reloaded\n", "")


@pytest.mark.parametrize("workers", [1, 2])
async def test_every_setting_a_reload_cannot_apply_is_in_the_notes(gateway_factory, upstream, workers):
    admin = free_port()
    gw = gateway_factory(lambda port: config(upstream, port, admin, workers=workers))
    changed = config(upstream, gw.port, admin, workers=workers).replace(
        f"admin: {{listen: 127.0.0.1:{admin}, token: {TOKEN}}}",
        f"admin: {{listen: 127.0.0.1:{free_port()}, token: another-{TOKEN}}}",
    ).replace("shutdown_timeout: 5s", "shutdown_timeout: 7s") + (
        f"metrics: {{listen: 127.0.0.1:{free_port()}}}\n"
        "store: {redis: {url: 'redis://127.0.0.1:1', on_error: local}}\n"
        "bans: {sync_interval: 2s}\n"
        "pid: elsewhere.pid\n"
        "server_tokens: on\n"  # applied by a reload: no note
    )
    gw.write_config(changed)
    status, reply = await post_reload(admin)  # the running admin API answers on its old address
    assert status == 200 and reply["reloaded"] is True and reply["errors"] == [], reply
    named = {str(note).split(" ", 1)[0] for note in reply["notes"]}  # type: ignore[attr-defined]
    assert named == {
        "admin.listen",
        "admin.token",
        "metrics.listen",
        "store",
        "bans.sync_interval",
        "shutdown_timeout",
        "pid",
        "state_dir",  # its default sits beside the pid file, so it moved with it
    }, reply
    assert f"another-{TOKEN}" not in json.dumps(reply)  # names the key, never a secret's value
    assert "metrics.listen changes take effect on restart" in gw.stderr()
