"""Bulk bans through the admin API and the CLI, paged listing, and access lists from files (embedded store)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from tests.support.config import config
from tests.support.gateway import cli
from tests.support.http import get, request
from tests.support.ports import free_port
from tests.support.upstreams import Upstream

TOKEN = "bulk-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


def bulk_config(upstream: Upstream, admin: int, extra: str = "") -> Callable[[int], str]:
    top = "log: {access: off}\nreal_ip: {from: [127.0.0.1], header: X-Real-IP}"
    return config(upstream, admin=admin, token=TOKEN, top=top, extra=extra)


async def call(method: str, url: str, body: Any = None) -> tuple[int, Any, dict[str, str]]:
    """The admin API with the token: (status, the JSON answer or None, headers)."""
    data = None if body is None else io.BytesIO(json.dumps(body).encode())
    reply = await request(method, url, headers=AUTH, data=data)
    return reply.status, reply.json() if reply.body.strip() else None, reply.headers


async def test_a_bulk_post_applies_the_valid_entries_and_says_why_others_were_not(gateway_factory, upstream):
    admin = free_port()
    gw = gateway_factory(bulk_config(upstream, admin))
    base = f"http://127.0.0.1:{admin}"
    entries = [
        "192.0.2.1",
        {"target": "198.51.100.0/24", "for": "0", "reason": "own reason"},
        12,
        "nope<script>",
        {"for": "1h"},
        "10.0.0.0/8",  # wider than /16: needs force
        "127.0.0.1",  # covers real_ip.from
        "192.0.2.1",  # a repeat
        {"target": "2001:db8::1", "for": "forever"},
    ]
    status, body, _ = await call("POST", base + "/bans", {"bans": entries, "for": "10m", "reason": "feed"})
    assert status == 200 and body["banned"] == 2
    assert [(r["index"], r["target"]) for r in body["refused"]] == [(5, "10.0.0.0/8"), (6, "127.0.0.1/32")]
    assert body["refused"][1]["reason"] == "127.0.0.1/32 covers 127.0.0.1/32 in real_ip.from"
    assert [i["index"] for i in body["invalid"]] == [2, 3, 4, 8]
    assert "<script>" not in json.dumps(body)  # nothing of the request is echoed
    _, listed, headers = await call("GET", base + "/bans")
    assert headers["X-Total-Count"] == "2"
    assert {(b["target"], b["reason"], b["remaining_s"] is None) for b in listed} == {
        ("192.0.2.1/32", "feed", False),
        ("198.51.100.0/24", "own reason", True),
    }
    assert (await get(gw.url + "/echo", headers={"X-Real-IP": "198.51.100.20"})).status == 403
    # force applies to the whole request
    status, body, _ = await call("POST", base + "/bans", {"bans": ["10.0.0.0/8"], "force": True})
    assert (status, body["banned"], body["refused"]) == (200, 1, [])
    # removal in bulk
    status, body, _ = await call("POST", base + "/bans/remove", {"targets": ["10.0.0.0/8", "192.0.2.99", "x"]})
    assert status == 200 and body == {
        "removed": 1,
        "not_banned": ["192.0.2.99/32"],
        "invalid": [{"index": 2, "error": "not an IP address or CIDR"}],
    }


async def test_bad_bulk_requests_get_a_400(gateway_factory, upstream):
    admin = free_port()
    gateway_factory(bulk_config(upstream, admin))
    base = f"http://127.0.0.1:{admin}"
    for body in (
        {"bans": "192.0.2.1"},
        {"bans": ["192.0.2.1"], "for": "soon"},
        {"bans": ["192.0.2.1"], "force": "yes"},
        {"bans": ["192.0.2.1"], "reason": ["x"]},
        {"bans": ["1.1.1.1"] * 200_001},
    ):
        status, reply, _ = await call("POST", base + "/bans", body)
        assert status == 400, body if len(json.dumps(body)) < 200 else "huge"
        assert reply["error"].startswith("bad ban request")
    for query in ("limit=0", "limit=abc", "limit=100001", "offset=-1", "match=10.0.0.0/33"):
        status, _, _ = await call("GET", base + "/bans?" + query)
        assert status == 400, query
    status, _, _ = await call("POST", base + "/bans/remove", {"targets": "192.0.2.1"})
    assert status == 400


async def test_ban_and_unban_from_a_file_report_bad_lines_by_number(gateway_factory, upstream, tmp_path):
    admin = free_port()
    gw = gateway_factory(bulk_config(upstream, admin))
    conf = str(gw.config_path)
    listfile = tmp_path / "feed.txt"
    listfile.write_text(
        "# feed\n192.0.2.1\n\n192.0.2.0/28 ; block\nnot an address\n10.0.0.0/8\n2001:db8::/64 # v6\n198.51.100.1\n"
    )
    done = cli("ban", "--file", str(listfile), "--for", "1d", "--reason", "feed", "-c", conf)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"gateway: {listfile}:5: not an IP address or CIDR: not",
        f"gateway: {listfile}:6: ban refused by the gateway: 10.0.0.0/8 is wider than /16; add --force",
    ]
    assert done.stdout == "banned 4 addresses and networks for 1d; 2 lines skipped\n"
    assert (await get(gw.url + "/echo", headers={"X-Real-IP": "192.0.2.9"})).status == 403
    # the same from stdin, with --force: the wide one goes in too
    done = cli("ban", "--file", "-", "--force", "--for", "0", "-c", conf, stdin="10.0.0.0/8\n")
    assert done.returncode == 0 and done.stdout == "banned 1 addresses and networks until unbanned\n", done.stderr
    listed = cli("bans", "--reason", "feed", "--limit", "2", "-c", conf)
    lines = listed.stdout.splitlines()
    assert lines[0].startswith("TARGET") and len(lines) == 4
    assert lines[-1] == "4 bans in force; shown 1-2"
    matched = json.loads(cli("bans", "--match", "192.0.2.0/24", "--json", "-c", conf).stdout)
    assert [b["target"] for b in matched] == ["192.0.2.0/28", "192.0.2.1/32"]
    second_page = cli("bans", "--reason", "feed", "--limit", "2", "--offset", "2", "-c", conf)
    assert second_page.stdout.splitlines()[-1] == "4 bans in force; shown 3-4"
    gone = cli("unban", "--file", str(listfile), "-c", conf)
    assert gone.returncode == 1 and gone.stderr.count("\n") == 1  # the bad line, once
    assert gone.stdout == "unbanned 5; 0 were not banned; 1 lines skipped\n"
    assert (await get(gw.url + "/echo", headers={"X-Real-IP": "192.0.2.9"})).status == 200
    both = cli("ban", "192.0.2.1", "--file", str(listfile), "-c", conf)
    assert both.returncode == 1 and both.stderr.count("\n") == 1 and "either" in both.stderr
    missing = cli("ban", "--file", str(tmp_path / "absent.txt"), "-c", conf)
    assert (
        missing.returncode == 1
        and missing.stderr.startswith("gateway: cannot read")
        and missing.stderr.count("\n") == 1
    )


async def test_access_lists_from_files_are_read_at_each_reload(gateway_factory, upstream, tmp_path):
    admin = free_port()
    deny = tmp_path / "deny.txt"
    allow = tmp_path / "allow.txt"
    deny.write_text("# denied\n203.0.113.0/24\n2001:db8:dead::/48\n")
    allow.write_text("198.51.100.5\n")
    make = bulk_config(upstream, admin, f"access: {{deny_file: {deny}, allow_file: {allow}, deny: [192.0.2.66]}}\n")
    gw = gateway_factory(make)
    conf = str(gw.config_path)
    assert (await get(gw.url + "/echo", headers={"X-Real-IP": "203.0.113.9"})).status == 403
    assert (
        await get(gw.url + "/echo", headers={"X-Real-IP": "192.0.2.66"})
    ).status == 403  # the inline list still counts
    assert (await get(gw.url + "/echo", headers={"X-Real-IP": "203.0.114.9"})).status == 200
    # allow_file: the policy knows it, and an allowed client is never banned
    refused = cli("ban", "198.51.100.0/24", "-c", conf)
    assert refused.returncode == 1 and "covers 198.51.100.5/32 in access.allow" in refused.stderr
    assert cli("ban", "198.51.100.0/24", "--force", "-c", conf).returncode == 0
    assert (await get(gw.url + "/echo", headers={"X-Real-IP": "198.51.100.5"})).status == 200
    assert (await get(gw.url + "/echo", headers={"X-Real-IP": "198.51.100.6"})).status == 403
    # a bad line: check names the file and the line; reload keeps the running lists
    deny.write_text("203.0.113.0/24\n\n999.1.1.1\n")
    checked = cli("check", "-c", conf)
    assert checked.returncode == 1 and f"{deny}:3: not an IP address or CIDR: 999.1.1.1" in checked.stderr
    assert cli("reload", "-c", conf).returncode == 1
    assert (await get(gw.url + "/echo", headers={"X-Real-IP": "203.0.113.9"})).status == 403
    deny.write_text("2001:db8:dead::/48\n")
    assert cli("reload", "-c", conf).returncode == 0
    assert (await get(gw.url + "/echo", headers={"X-Real-IP": "203.0.113.9"})).status == 200


def test_a_relative_list_file_is_found_next_to_the_configuration(tmp_path: Path) -> None:
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists" / "deny.txt").write_text("192.0.2.0/24\n")
    conf = tmp_path / "limits.yaml"
    conf.write_text(
        "access: {deny_file: lists/deny.txt}\nupstreams: {app: {servers: ['127.0.0.1:9']}}\n"
        "routes: [{location: /, upstream: app}]\n"
    )
    assert cli("check", "-c", str(conf)).returncode == 0
    (tmp_path / "lists" / "deny.txt").unlink()
    failed = cli("check", "-c", str(conf))
    assert failed.returncode == 1 and "access.deny_file: cannot read" in failed.stderr


async def test_hostile_input_gets_a_4xx_or_a_line_number_never_a_traceback(gateway_factory, upstream, tmp_path):
    admin = free_port()
    gw = gateway_factory(bulk_config(upstream, admin))
    base = f"http://127.0.0.1:{admin}"
    async with aiohttp.ClientSession() as session:
        big = io.BytesIO(b'{"bans": ["' + b"1" * (17 * 1024 * 1024) + b'"]}')
        async with session.post(base + "/bans", headers=AUTH, data=big) as resp:
            assert resp.status == 413
        nobody = {"Content-Type": "application/json"}
        async with session.post(base + "/bans", headers=nobody, data=io.BytesIO(b"[" * 1000)) as resp:
            assert resp.status == 401  # the token first: the body is not even read
    junk = tmp_path / "junk.txt"
    junk.write_bytes(b"192.0.2.1\n\x00\x1b[31mred\n" + b"\xff\xfe" * 50 + b"\n" + b"9" * 10000 + b"\n")
    done = cli("ban", "--file", str(junk), "-c", str(gw.config_path))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert [line.split(":")[2] for line in lines] == ["2", "3", "4"]  # junk.txt:N: for each bad line
    assert all(len(line) < 250 and "\x1b" not in line for line in lines)  # short, no terminal escapes
    assert done.stdout == "banned 1 addresses and networks for 1h; 3 lines skipped\n"
    assert "Traceback" not in gw.stderr()
