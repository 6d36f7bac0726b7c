"""The differential again, with the gateway config produced by ``gateway import-nginx`` from nginx's own.

conftest.py runs nginx and the gateway on configurations generated side by side from the
scenarios. Here only nginx's configuration is generated; the gateway's is what the importer
makes of it (only the listen port, the admin API and the log format/target are set for the
harness, which reads the gateway's JSON access log and error lines). The same schedule, the
same model, the same tolerances: the decisions must be equal.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gateway.nginxconf.emit import render
from gateway.nginxconf.parser import parse_config
from gateway.nginxconf.translate import translate
from tests.differential import harness
from tests.differential.conftest import STAGGER_MS, _hold, find_nginx, run_and_compare
from tests.differential.scenarios import ALL
from tests.helpers import Gateway, Upstream, free_port

pytestmark = pytest.mark.nginx

# Directives of the generated nginx.conf that are about running nginx itself, not about limits.
PROCESS_ONLY = {
    "daemon", "master_process", "pid", "client_body_temp_path", "proxy_temp_path", "fastcgi_temp_path",
    "uwsgi_temp_path", "scgi_temp_path", "log_format",
}  # fmt: skip


@dataclasses.dataclass
class Imported:
    run: harness.Run
    yaml_text: str
    skipped: list[str]


def imported_yaml(nginx_conf: Path, port: int) -> tuple[str, list[str]]:
    result = translate(parse_config(str(nginx_conf)))
    doc = yaml.safe_load(render(result, nginx_conf.name))
    doc["listen"] = f"127.0.0.1:{port}"
    doc["admin"] = {"listen": "off"}
    doc["shutdown_timeout"] = "2s"
    doc["log"] = {"format": "json", "level": doc.get("log", {}).get("level", "info")}
    return yaml.safe_dump(doc, sort_keys=False), [s.text.split()[0] for s in result.skipped]


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Imported]:
    binary = find_nginx()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("the nginx binary is required for the differential tests when CI is set")
        pytest.skip("nginx binary not found (differential tests need it)")
    workdir: Path = tmp_path_factory.mktemp("imported")
    scenarios = [dataclasses.replace(s, start_offset_ms=k * STAGGER_MS) for k, s in enumerate(ALL)]
    jitter = harness.default_jitter()
    upstream = Upstream("diff").start()
    upstream.hooks["echo"] = _hold
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
        yield Imported(run_and_compare(nginx, gateway, scenarios, jitter, workdir), gateway_text, skipped)
    finally:
        gateway.stop()
        nginx.stop()
        upstream.stop()


def test_only_process_directives_were_skipped(imported: Imported) -> None:
    assert set(imported.skipped) <= PROCESS_ONLY, imported.skipped
    doc = yaml.safe_load(imported.yaml_text)
    assert len(doc["zones"]) == sum(len(s.zones) for s in ALL)
    assert doc["routes"][0]["location"] == "/"


@pytest.mark.parametrize("name", [s.name for s in ALL])
def test_imported_config_decides_like_nginx(name: str, imported: Imported) -> None:
    comparison = imported.run.comparisons[name]
    if comparison.errors:
        pytest.fail(comparison.report(), pytrace=False)
