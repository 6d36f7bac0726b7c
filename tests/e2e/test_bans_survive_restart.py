"""The embedded store's bans survive a restart: a graceful stop (SIGTERM) and a ``kill -9``.

Bans go in through the CLI and the admin API; the gateway stops and starts again through
its CLI; the first request after the port opens is already refused. An unban survives too;
a ban that ended while the gateway was down is gone, from the table and from the file.
A database that cannot be used stops the start with one line naming it.
"""

from __future__ import annotations

import http.client
import json
import signal
import sqlite3
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.gateway import Gateway, cli
from tests.support.ports import free_port

pytestmark = [pytest.mark.slow]

TOKEN = "s3cret"
KEPT = ["198.51.100.1", "2001:db8::/48"]  # until unbanned / for an hour
ENDS = "198.51.100.2"  # for 2 s: ends while the gateway is down
UNBANNED = "198.51.100.3"
FILE = [f"203.0.113.{i}" for i in range(1, 101)]  # ban --file


def config(admin_port: int, workers: int) -> object:
    def build(port: int) -> str:
        return f"""
listen: 127.0.0.1:{port}
workers: {workers}
shutdown_timeout: 2s
admin: {{listen: 127.0.0.1:{admin_port}, token: {TOKEN}}}
real_ip: {{from: [127.0.0.1, "::1"], header: X-Real-IP}}
state_dir: state
routes:
  - {{location: /, return: {{code: 200, text: ok}}}}
"""

    return build


def status(gw: Gateway, client: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=5)
    try:
        conn.request("GET", "/", headers={"X-Real-IP": client})
        return conn.getresponse().status
    finally:
        conn.close()


def admin(port: int, method: str, path: str, body: object = None) -> object:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    request.add_header("Authorization", f"Bearer {TOKEN}")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read())


def ok(*args: str, stdin: str | None = None) -> str:
    done = cli(*args, stdin=stdin)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("workers", [1, 2])
def test_bans_are_in_force_on_the_first_request_after_a_restart(gateway_factory, workers: int) -> None:
    admin_port = free_port()
    gw = gateway_factory(config(admin_port, workers))
    conf = str(gw.config_path)
    ok("ban", KEPT[0], "--for", "0", "--reason", "by hand", "-c", conf)
    admin(admin_port, "POST", "/bans", {"target": KEPT[1], "for": "1h", "reason": "api"})
    ok("ban", UNBANNED, "-c", conf)
    ok("ban", "--file", "-", "--for", "1h", "--reason", "feed", "-c", conf, stdin="\n".join(FILE) + "\n")
    ok("unban", UNBANNED, "-c", conf)
    before = json.loads(ok("bans", "--json", "-c", conf))
    short = admin(admin_port, "POST", "/bans", {"target": ENDS, "for": "2s"})
    ends_at = short["until_ms"] / 1000  # type: ignore[index]
    assert status(gw, ENDS) == 403
    assert status(gw, "198.51.100.1") == 403 and status(gw, UNBANNED) == 200

    for how in ("SIGTERM", "SIGKILL"):
        assert gw.proc is not None
        if how == "SIGTERM":
            assert gw.stop() == 0
        else:
            gw.proc.send_signal(signal.SIGKILL)  # the master alone, with workers: they follow it
            gw.proc.wait()
            time.sleep(1.5 if workers > 1 else 0)  # its workers notice it is gone and leave
        time.sleep(max(0.0, ends_at + 0.2 - time.time()))  # the short ban ends while it is down
        gw.start()
        assert status(gw, "198.51.100.1") == 403, (how, gw.stderr())  # the first request
        assert status(gw, "2001:db8::1") == 403
        assert status(gw, "203.0.113.77") == 403
        assert status(gw, UNBANNED) == 200 and status(gw, ENDS) == 200 and status(gw, "192.0.2.1") == 200
        after = json.loads(ok("bans", "--json", "-c", conf))
        assert {item["target"] for item in after} == {i["target"] for i in before}
        kept = {i["target"]: (i["until_ms"], i["reason"]) for i in before}
        assert all(kept[i["target"]] == (i["until_ms"], i["reason"]) for i in after)
        assert "bans in force loaded from" in gw.stderr()

    database = Path(conf).parent / "state" / "bans.sqlite3"
    with sqlite3.connect(database) as db:  # the ended one left the file at start
        targets = {row[0] for row in db.execute("SELECT target FROM bans")}
    assert ENDS + "/32" not in targets and len(targets) == len(KEPT) + len(FILE)


def test_a_damaged_database_stops_the_start_naming_it(gateway_factory, tmp_path: Path) -> None:
    admin_port = free_port()
    gw = gateway_factory(config(admin_port, 1), start=False)
    state = gw.config_path.parent / "state"
    state.mkdir()
    (state / "bans.sqlite3").write_bytes(b"this is not a database" * 100)
    with pytest.raises(RuntimeError) as failed:
        gw.start(timeout=10)
    message = str(failed.value)
    assert str(state / "bans.sqlite3") in message and "Traceback" not in message


def test_check_warns_when_the_state_dir_cannot_be_made(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("a file where the directory would go")
    conf = tmp_path / "g.yaml"
    conf.write_text(
        f"listen: 127.0.0.1:{free_port()}\nstate_dir: taken/state\n"
        "routes:\n  - {location: /, return: {code: 200, text: ok}}\n"
    )
    done = cli("check", "-c", str(conf))
    assert done.returncode == 0 and "ok" in done.stdout
    assert f"state_dir {tmp_path / 'taken' / 'state'}" in done.stderr and "not a directory" in done.stderr
