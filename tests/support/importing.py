"""``gateway import-nginx`` run for tests: on an nginx.conf text through the CLI's entry, its output
checked by ``gateway check`` (``run``), or translated in process for a harness (``imported_yaml``);
and a request context for evaluating the compiled plan of what it wrote (``request_context``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from gateway.cli.commands import main
from gateway.http.context import RequestContext
from gateway.http.realip import parse_addr
from gateway.nginxconf.emit import render
from gateway.nginxconf.parser import parse_config
from gateway.nginxconf.translate import translate

__all__ = ["APP", "PROCESS_ONLY", "Imported", "imported_yaml", "request_context", "run"]

APP = "proxy_pass http://127.0.0.1:9000;"
# Directives of the generated nginx.conf that are about running nginx itself, not about limits.
PROCESS_ONLY = {
    "daemon", "master_process", "pid", "client_body_temp_path", "proxy_temp_path", "fastcgi_temp_path",
    "uwsgi_temp_path", "scgi_temp_path", "log_format",
}  # fmt: skip


@dataclass
class Imported:
    code: int
    doc: Any
    stderr: str
    text: str

    def routes(self) -> dict[str, Any]:
        return {r["location"]: r for r in self.doc["routes"]}

    def skipped(self, where: str) -> str:
        """The skip lines of ``nginx.conf:<where>`` (a line number)."""
        lines = [line for line in self.stderr.splitlines() if f"nginx.conf:{where}: " in line and "skipped:" in line]
        assert lines, (where, self.stderr)
        return "\n".join(lines)


def run(tmp_path: Path, capsys: pytest.CaptureFixture[str], conf: str, *flags: str) -> Imported:
    path = tmp_path / "nginx.conf"
    path.write_text(conf)
    out = tmp_path / "out.yaml"
    out.unlink(missing_ok=True)
    capsys.readouterr()
    code = main(["import-nginx", str(path), "-o", str(out), *flags])
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr
    if code == 1:
        assert not out.exists()
        return Imported(code, None, stderr, "")
    assert main(["check", "-c", str(out)]) == 0, stderr + out.read_text()
    assert capsys.readouterr().out.strip() == "ok"
    text = out.read_text()
    return Imported(code, yaml.safe_load(text), stderr, text)


def imported_yaml(nginx_conf: Path, port: int) -> tuple[str, list[str]]:
    """What the importer makes of ``nginx_conf``, listening on ``port`` for a harness (no admin API, JSON
    logs), and the names of the directives it skipped."""
    result = translate(parse_config(str(nginx_conf)))
    doc = yaml.safe_load(render(result, nginx_conf.name))
    doc["listen"] = f"127.0.0.1:{port}"
    doc["admin"] = {"listen": "off"}
    doc["shutdown_timeout"] = "2s"
    doc["log"] = {"format": "json", "level": doc.get("log", {}).get("level", "info")}
    return yaml.safe_dump(doc, sort_keys=False), [s.text.split()[0] for s in result.skipped]


def request_context(
    method: str = "GET", target: str = "/", headers: dict[str, str] | None = None, client: str = "192.0.2.7"
) -> RequestContext:
    """A request as the plan sees it, from ``client``, its URI not yet rewritten."""
    request = make_mocked_request(method, target, headers=CIMultiDict(headers or {}))
    peer = parse_addr(client)
    assert peer is not None
    ctx = RequestContext(request, 0.0, peer, "http", 80)
    ctx.uri = ctx.path_only
    return ctx
