"""The gateway routes and limits on what nginx and the backend see, for generated request targets.

Hypothesis writes request targets from the pieces of path confusion (``#``, ``?``, valid and
invalid ``%`` escapes, ``.`` and ``..`` plain and encoded, ``;`` path parameters, ``//``, ``\\``,
double encoding, overlong UTF-8) in every position, and each goes to the real nginx binary
and to the gateway (its CLI), both configured with the same ``=``, prefix, ``^~`` and regex
locations, some answering 403 with a tag, the others proxied to one recording upstream with
a tag header, one of them behind a 1r/m ``limit_req``. For every target:

* where nginx answers 400, the gateway answers 400;
* otherwise both choose the same location with the same status, and the same ``$uri``
  (the 403 answers name it; nginx proxies it escaped, with a URI in ``proxy_pass``);
* the gateway answers 400 where nginx does not only for what docs/security.md says it
  refuses: a fragment, a double-encoded or overlong escape, and a ``$uri`` that a backend
  reading ``;`` as a path parameter or ``\\`` as a separator resolves to a path nginx
  routes elsewhere (asked of nginx itself, on a second server without the limit);
* the path the gateway proxies is canonical (no dot segment, no empty segment, no
  escaped ``/``) and decodes to nginx's ``$uri``; the query goes as it came;
* the limited location lets through no more on the gateway than on nginx.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote_from_bytes, unquote_to_bytes

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.gateway import Gateway
from tests.support.http import exchange
from tests.support.nginx import NginxProcess, find_nginx
from tests.support.ports import free_port
from tests.support.upstreams import HeadEchoUpstream

# (location, tag, answer): 403 answers name the location and $uri; the others are proxied.
LOCATIONS = [
    ("= /admin", "exact-admin", 403),
    ("/admin/", "prefix-admin", 403),
    ("^~ /static/", "static", 0),
    ("~ \\.php$", "php", 403),
    ("~* ^/api/v[0-9]+/", "api", 0),
    ("/login", "login", 0),
    ("/", "root", 0),
]


def nginx_conf(workdir: Path, port: int, oracle_port: int, upstream: str) -> str:
    def server(listen: int, limited: bool) -> str:
        blocks = []
        for location, tag, code in LOCATIONS:
            if code:
                body = f'return {code} "{tag} $uri";'
            else:
                prefix = location.split()[-1]
                uri = prefix if not location.startswith("~") else ""
                limit = "limit_req zone=tight;" if limited and tag == "login" else ""
                body = f"{limit} proxy_set_header X-Loc {tag}; proxy_pass http://{upstream}{uri};"
            blocks.append(f"    location {location} {{ {body} }}")
        return f"  server {{\n    listen 127.0.0.1:{listen};\n" + "\n".join(blocks) + "\n  }\n"

    temp = " ".join(
        f"{kind}_temp_path {workdir}/{kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return (
        f"daemon off;\nworker_processes 1;\npid {workdir}/nginx.pid;\nevents {{ worker_connections 256; }}\n"
        f"http {{\n  access_log off;\n  {temp}\n"
        "  limit_req_zone $binary_remote_addr zone=tight:1m rate=1r/m;\n"
        + server(port, True)
        + server(oracle_port, False)
        + "}\n"
    )


def gateway_yaml(port: int, upstream: str) -> str:
    routes = []
    for location, tag, code in LOCATIONS:
        if code:
            routes.append(f"  - location: '{location}'\n    return: {{code: {code}, text: '{tag} $uri'}}")
        else:
            limit = "\n    limit_req: [{zone: tight}]" if tag == "login" else ""
            routes.append(
                f"  - location: '{location}'\n    upstream: app\n    proxy_set_header: {{X-Loc: {tag}}}{limit}"
            )
    return (
        f"listen: 127.0.0.1:{port}\nlog: {{access: off}}\n"
        f"upstreams:\n  app:\n    servers: [{upstream}]\n"
        "zones:\n  tight: {type: req, key: $binary_remote_addr, rate: 1r/m}\n"
        "routes:\n" + "\n".join(routes) + "\n"
    )


@dataclass
class Answer:
    status: int
    tag: str  # the location's tag, "redirect <path>", or "" for an error page
    uri: bytes  # nginx's $uri as the location saw it (403 answers) or as the upstream got it, decoded
    upstream_target: str  # proxied: the target the upstream received; else ""


def ask(port: int, target: bytes) -> Answer:
    out = exchange(port, b"GET " + target + b" HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ")[1])
    fields = {k.lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
    if status in (301, 302):
        location = re.sub(rb"^https?://[^/]*", b"", fields.get(b"location", b""))
        return Answer(status, "redirect " + location.decode("latin-1"), b"", "")
    if body.startswith(b"{"):
        seen = json.loads(body)
        headers = {k.lower(): v for k, v in seen["headers"]}
        path = seen["target"].split("?", 1)[0]
        return Answer(status, headers.get("x-loc", "?"), unquote_to_bytes(path), seen["target"])
    if status == 403:
        tag, _, uri = body.partition(b" ")
        return Answer(status, tag.decode(), uri, "")
    if status == 503:
        return Answer(status, "login", b"", "")  # the limited location's rejection: the only 503
    return Answer(status, "", b"", "")


# Refused beyond nginx (docs/security.md), restated here as the test's own oracle.
SECOND_LEVEL = re.compile(rb"%(?:2[eEfF]|5[cC]|3[bB]|00)|[\xc0\xc1]|\xe0[\x80-\x9f]|\xf0[\x80-\x8f]")


def resolve(path: bytes) -> bytes | None:
    """Dot segments resolved and slashes merged; None above the root."""
    out: list[bytes] = []
    parts = path.split(b"/")[1:]
    for index, segment in enumerate(parts):
        last = index == len(parts) - 1
        if segment in (b".", b".."):
            if segment == b".." and not out:
                return None
            if segment == b"..":
                out.pop()
            if last:
                out.append(b"")
        elif segment or last:
            out.append(segment)
    return b"/" + b"/".join(out)


def readings(uri: bytes) -> list[bytes | None]:
    """How Tomcat/Spring (``;`` parameters) and IIS/WHATWG parsers (``\\``) read nginx's $uri."""

    def strip(path: bytes) -> bytes:
        return b"/".join(segment.split(b";", 1)[0] for segment in path.split(b"/"))

    found = []
    if b";" in uri:
        found.append(resolve(strip(uri)))
    if b"\\" in uri:
        found.append(resolve(uri.replace(b"\\", b"/")))
        if b";" in uri:
            found.append(resolve(strip(uri.replace(b"\\", b"/"))))
    return found


def canonical(path: str) -> bool:
    segments = path.split("/")[1:]
    return (
        path.startswith("/")
        and not any(s in (".", "..") for s in segments)
        and "" not in segments[:-1]
        and "%2f" not in path.lower()
    )


PIECES = st.sampled_from(
    ["admin", "static", "login", "api", "v1", "API", "x.php", "a", ".", "..", "%2e", "%2E%2e", ".%2e", "%2f", "%2F"]
    + [";", ";x=y", "..;", ";/", "\\", "%5c", "%5C", "//", "%", "%2", "%zz", "%0", "%00", "%3f", "%3F", "?", "#"]
    + ["%23", "%25", "%252e", "%252F", "%c0%ae", "%e0%80%ae", "%41", "%20", "%ff", "%C3%A9", ".php", "=", "&"]
)
TARGETS = st.lists(st.one_of(st.just("/"), st.just("/"), PIECES), min_size=0, max_size=10).map(
    lambda parts: ("/" + "".join(parts)).encode()
)


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[tuple[int, int, int]]:
    binary = find_nginx()
    if binary is None:
        pytest.skip("nginx binary not found (differential tests need it)")
    workdir = tmp_path_factory.mktemp("targets")
    upstream = HeadEchoUpstream().start()
    nginx_port, oracle_port, gateway_port = free_port(), free_port(), free_port()
    (workdir / "nginx").mkdir()
    nginx = NginxProcess(
        binary, workdir / "nginx", nginx_conf(workdir / "nginx", nginx_port, oracle_port, upstream.address), nginx_port
    ).start()
    (workdir / "gateway").mkdir()
    gateway = Gateway(workdir / "gateway", gateway_yaml(gateway_port, upstream.address), gateway_port).start()
    yield nginx_port, oracle_port, gateway_port
    gateway.stop()
    nginx.stop()
    upstream.stop()


STARTED = time.monotonic()
PASSED = {"nginx": 0, "gateway": 0}  # requests the limited location let through, per side


def refusal_explained(target: bytes, seen: Answer, oracle_port: int) -> str:
    """Why the gateway may refuse what nginx took ("" when it may not)."""
    if b"#" in target:
        return "fragment"
    uri = seen.uri
    if SECOND_LEVEL.search(uri):
        return "double-encoded or overlong"
    for reading in readings(uri):
        if reading is None:
            return "a reading climbs above the root"
        other = ask(oracle_port, quote_from_bytes(reading, safe="/;\\=&!$'()*+,:@~").encode())
        if other.tag != seen.tag:
            return f"a reading goes to {other.tag or other.status}"
    return ""


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(target=TARGETS)
def test_nginx_and_the_gateway_route_and_limit_every_target_alike(servers, target):
    nginx_port, oracle_port, gateway_port = servers
    reference = ask(oracle_port, target)  # nginx without the limit: its location and $uri
    nginx = ask(nginx_port, target)
    gateway = ask(gateway_port, target)
    for side, answer in (("nginx", nginx), ("gateway", gateway)):
        PASSED[side] += answer.tag == "login" and answer.status == 200
    # the tight limit: nothing more let through on the gateway than on nginx (1r/m, plus what refilled)
    allowed = 1 + int((time.monotonic() - STARTED) // 60)
    assert PASSED["gateway"] <= max(PASSED["nginx"], allowed), (target, PASSED)
    if nginx.status == 400:
        assert gateway.status == 400, (target, gateway)
        return
    if gateway.status == 400:
        why = refusal_explained(target, reference, oracle_port)
        assert why, (target, reference)
        return
    assert gateway.tag == reference.tag, (target, reference, gateway)
    if reference.tag == "login":
        assert {nginx.status, gateway.status} <= {200, 503}, (target, nginx, gateway)  # the count: above
    else:
        assert gateway.status == nginx.status, (target, nginx, gateway)
    if gateway.status != 503:
        assert gateway.uri == reference.uri, (target, reference, gateway)
    if gateway.upstream_target:
        path, _, query = gateway.upstream_target.partition("?")
        assert canonical(path), (target, gateway.upstream_target)
        sent_query = target.partition(b"?")[2].decode("latin-1")
        assert query == sent_query, (target, gateway.upstream_target)
