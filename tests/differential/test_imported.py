"""The differential again, with the gateway config produced by ``gateway import-nginx`` from nginx's own.

conftest.py runs nginx and the gateway on configurations generated side by side from the
scenarios. Here only nginx's configuration is generated; the gateway's is what the importer
makes of it (only the listen port, the admin API and the log format/target are set for the
harness, which reads the gateway's JSON access log and error lines). The same schedule, the
same model, the same tolerances: the decisions must be equal.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gateway.nginxconf.emit import render
from gateway.nginxconf.parser import parse_config
from gateway.nginxconf.translate import translate
from tests.support.differential import harness
from tests.support.differential.scenarios import ALL
from tests.support.gateway import Gateway
from tests.support.importing import PROCESS_ONLY, imported_yaml
from tests.support.nginx import find_nginx, single_worker_conf
from tests.support.ports import free_port
from tests.support.upstreams import Upstream


@dataclasses.dataclass
class Imported:
    run: harness.Run
    yaml_text: str
    skipped: list[str]


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Imported]:
    binary = find_nginx()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("the nginx binary is required for the differential tests when CI is set")
        pytest.skip("nginx binary not found (differential tests need it)")
    workdir: Path = tmp_path_factory.mktemp("imported")
    scenarios = [dataclasses.replace(s, start_offset_ms=k * harness.STAGGER_MS) for k, s in enumerate(ALL)]
    jitter = harness.default_jitter()
    upstream = Upstream("diff").start()
    upstream.hooks["echo"] = harness.hold_request
    nginx_dir, gateway_dir = workdir / "nginx", workdir / "gateway"
    nginx_dir.mkdir()
    gateway_dir.mkdir()
    nginx_port, gateway_port = free_port(), free_port()
    conf_text = harness.nginx_conf(nginx_dir, nginx_port, upstream.address, scenarios)
    (nginx_dir / "nginx.conf").write_text(conf_text)
    gateway_text, skipped = imported_yaml(nginx_dir / "nginx.conf", gateway_port)
    nginx = harness.Nginx(binary, nginx_dir, conf_text, nginx_port)
    gateway = Gateway(gateway_dir, gateway_text, gateway_port)
    try:
        yield Imported(harness.run_and_compare(nginx, gateway, scenarios, jitter, workdir), gateway_text, skipped)
    finally:
        gateway.stop()
        nginx.stop()
        upstream.stop()


def test_only_process_directives_were_skipped(imported: Imported) -> None:
    assert set(imported.skipped) <= PROCESS_ONLY, imported.skipped
    doc = yaml.safe_load(imported.yaml_text)
    assert len(doc["zones"]) == sum(len(s.zones) for s in ALL)
    assert doc["routes"][0]["location"] == "/"


@pytest.mark.timing
@pytest.mark.parametrize("name", [s.name for s in ALL])
def test_imported_config_decides_like_nginx(name: str, imported: Imported) -> None:
    comparison = imported.run.comparisons[name]
    if comparison.errors:
        pytest.fail(comparison.report(), pytrace=False)


# -- two server blocks: virtual hosts, per-server limits and the route features, side by side ----


def _two_servers_conf(d: Path, port: int, upstream: str) -> str:
    return single_worker_conf(
        d,
        f"""    access_log off;
    limit_req_zone $binary_remote_addr zone=strict:1m rate=1r/m;
    limit_req_zone $binary_remote_addr zone=loose:1m rate=1r/m;
    limit_req_status 429;
    server {{
        listen 127.0.0.1:{port};
        server_name api.test *.api.test;
        location /v/ {{
            limit_req zone=strict;
            proxy_set_header X-Seen "api $host";
            add_header X-Server api;
            proxy_pass http://{upstream}/inner/;
        }}
        location = /moved {{ return 301 https://elsewhere.test$request_uri; }}
    }}
    server {{
        listen 127.0.0.1:{port} default_server;
        server_name www.*;
        location /v/ {{
            limit_req zone=loose burst=2 nodelay;
            add_header X-Server www always;
            proxy_pass http://{upstream};
        }}
        location / {{ return 403 "no"; }}
    }}
""",
    )


async def _ask(port: int, host: str, target: str) -> tuple[int, str, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    data = await asyncio.wait_for(reader.read(65536), 5)
    writer.close()
    head, _, body = data.decode(errors="replace").partition("\r\n\r\n")
    lines = head.split("\r\n")
    fields = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    interesting = f"server={fields.get('x-server', '')} location={fields.get('location', '')}"
    return int(lines[0].split()[1]), interesting, body if int(lines[0].split()[1]) == 403 else ""


@pytest.mark.timing
def test_two_server_blocks_decide_like_nginx(tmp_path: Path) -> None:
    binary = find_nginx()
    if binary is None:
        pytest.skip("nginx binary not found (differential tests need it)")
    upstream = Upstream("vhosts").start()
    nginx_dir, gateway_dir = tmp_path / "nginx", tmp_path / "gateway"
    nginx_dir.mkdir()
    gateway_dir.mkdir()
    nginx_port, gateway_port = free_port(), free_port()
    conf_text = _two_servers_conf(nginx_dir, nginx_port, upstream.address)
    (nginx_dir / "nginx.conf").write_text(conf_text)
    result = translate(parse_config(str(nginx_dir / "nginx.conf")))
    doc = yaml.safe_load(render(result, "nginx.conf"))
    assert {s.text.split()[0] for s in result.skipped} <= PROCESS_ONLY | {"access_log"}
    assert len(doc["servers"]) == 2
    for server in doc["servers"]:
        server["listen"] = [f"127.0.0.1:{gateway_port}"]
    doc["admin"] = {"listen": "off"}
    doc["shutdown_timeout"] = "2s"
    nginx = harness.Nginx(binary, nginx_dir, conf_text, nginx_port)
    gateway = Gateway(gateway_dir, yaml.safe_dump(doc, sort_keys=False), gateway_port)
    schedule = [
        ("api.test", "/v/a?x=1"),
        ("x.API.test:1234", "/v/b"),  # the same server (and zone) by wildcard; the second: over the limit
        ("www.example.com", "/v/a"),
        ("www.example.com", "/v/b"),
        ("www.example.com", "/v/c"),  # burst 2 nodelay: three pass, the fourth is refused
        ("www.example.com", "/v/d"),
        ("unknown.test", "/v/e"),  # the default server (www.*), its zone is already used up
        ("api.test", "/moved?q=1"),
        ("api.test", "/nothing"),  # no location in api.test: 404 in both
        ("unknown.test", "/other"),
    ]
    try:
        nginx.start()
        gateway.start()

        async def run(port: int) -> tuple[list[tuple[int, str, str]], list[str]]:
            answers = []
            paths = []
            for host, target in schedule:
                before = len(upstream.seen)
                answers.append(await _ask(port, host, target))
                if len(upstream.seen) > before:
                    seen = upstream.seen[-1]
                    headers = {k.lower(): v for k, v in seen["headers"]}
                    paths.append(f"{seen['path']} {headers.get('x-seen', '')}")
            return answers, paths

        from_nginx = asyncio.run(run(nginx_port))
        from_gateway = asyncio.run(run(gateway_port))
    finally:
        gateway.stop()
        nginx.stop()
        upstream.stop()
    assert [a[0] for a in from_nginx[0]] == [200, 429, 200, 200, 200, 429, 429, 301, 404, 403]
    assert from_gateway[0] == from_nginx[0]
    assert from_gateway[1] == from_nginx[1] == ["/inner/a?x=1 api api.test", "/v/a ", "/v/b ", "/v/c "]
