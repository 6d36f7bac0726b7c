"""Every configuration of the corpus from public projects (``tests/nginx_corpus/wild/``, issue 24):
``gateway import-nginx`` gives a configuration that passes ``gateway check``, or exits 1 and says
why in one line.

The corpus holds main files, sites, include-only fragments and unrendered templates alike; a
fragment or a PHP site exits 1 ("nothing is proxied..."), a template nginx rejects too exits
1 at its parse error. Nothing else is accepted: no traceback, no output that does not check.
A few files whose translation is known are held to it (``KNOWN``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.cli.commands import main

WILD = Path(__file__).resolve().parents[1] / "nginx_corpus" / "wild"
FILES = sorted(p for p in WILD.rglob("*") if p.is_file() and p.name not in ("SOURCE.md", "README.md"))
# at least this many files must import into a configuration that checks (26 when this was written;
# 27 once map, geo and if-return were translated)
MIN_RUNNING = 27


def _import(conf: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["import-nginx", str(conf), "-o", str(out)])
    return code, capsys.readouterr().err


def test_the_corpus_is_there_with_its_sources() -> None:
    assert len(FILES) >= 150
    readme = (WILD / "README.md").read_text()
    for project in sorted(p for p in WILD.iterdir() if p.is_dir()):
        assert (project / "SOURCE.md").is_file(), project
        assert f"`{project.name}/" in readme, project


@pytest.mark.parametrize("conf", FILES, ids=[str(p.relative_to(WILD)) for p in FILES])
def test_an_import_checks_or_says_why_in_one_line(
    conf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gateway.yaml"
    code, stderr = _import(conf, out, capsys)
    assert "Traceback" not in stderr
    assert code in (0, 1, 2), stderr
    if code == 1:
        assert not out.exists()
        last = stderr.strip().splitlines()[-1]
        assert last.startswith("gateway: ") and " skipped: " not in last and len(last) < 400, stderr
        return
    text = out.read_text()
    assert "routes: null" not in text and "routes: []" not in text
    assert main(["check", "-c", str(out)]) == 0, stderr + text
    assert capsys.readouterr().out.strip() == "ok"


def test_most_of_the_corpus_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    running = [conf for i, conf in enumerate(FILES) if _import(conf, tmp_path / f"{i}.yaml", capsys)[0] != 1]
    assert len(running) >= MIN_RUNNING, [str(p.relative_to(WILD)) for p in running]


def _doc(conf: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    out = tmp_path / "gateway.yaml"
    code, stderr = _import(WILD / conf, out, capsys)
    assert code in (0, 2), stderr
    doc = yaml.safe_load(out.read_text())
    assert isinstance(doc, dict)
    return doc


def test_known_translations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Lemmy (rendered): the 443 server with `listen 443 ssl http2` is no longer dropped for http2; without
    # its certificate here its ssl listen is left out, and the :80 server's return is a return route
    lemmy = _doc("lemmy/docker/prod/nginx.conf.rendered-example.com", tmp_path, capsys)
    assert "limit_req_zone" not in str(lemmy) and lemmy.get("zones")
    # cal-itp: `upstream app_server { server unix:... }` keeps its socket (never invented as app_server:80)
    cal = _doc("cal-itp-benefits/appcontainer/nginx.conf", tmp_path, capsys)
    upstreams = cal.get("upstreams", {})
    assert isinstance(upstreams, dict)
    assert upstreams["app_server"]["servers"] == [{"address": "unix:/calitp/run/gunicorn.sock", "fail_timeout": "0"}]
    # discourse: its four thin sockets are the upstream's servers
    discourse = _doc("discourse/config/nginx.sample.conf", tmp_path, capsys)
    assert "unix:/var/www/discourse/tmp/sockets/thin.3.sock" in str(discourse["upstreams"])
    # the h5bp no-ssl template: the server-level `return 301 $scheme://example.com$request_uri;` is a route
    h5bp = _doc("h5bp-server-configs-nginx/conf.d/templates/no-ssl.example.com.conf", tmp_path, capsys)
    assert "return" in str(h5bp)
    # mediacms: a server-level `if ($request_uri ~ '...\\.\\.') { return 403; }` is a rule, not a refusing route,
    # and its `map $http_x_forwarded_proto $forwarded_proto` (used in a proxy_set_header) is written
    media = _doc("mediacms/deploy/docker/nginx_http_only.conf", tmp_path, capsys)
    assert [r["return"] for r in media["rules"]] == [403] and "forwarded_proto" in media["maps"]  # type: ignore[index]
    assert "if ($request_uri" not in (tmp_path / "gateway.yaml").read_text()  # not listed: translated
    # cal-itp: the POST-only zone keyed by `map $request_method $limit` keeps its limit
    cal = _doc("cal-itp-benefits/appcontainer/nginx.conf", tmp_path, capsys)
    assert "limit" in cal["maps"] and cal["zones"]  # type: ignore[operator]
    # wordpress (pothi): `if ($arg_author != '') { return 403; }` (an include of every site) is a server rule
    pothi = _doc("wordpress-nginx-pothi/sites-available/nginx-varnish-apache.conf", tmp_path, capsys)
    assert pothi["rules"] == [{"if": "$arg_author != ''", "return": 403}]
    # ...but where `error_page 418 = @phpfpm` takes over the 418 its ifs return, nginx hands the request on:
    # not translated, they fail closed, and with nothing left to proxy the import says so
    code, stderr = _import(
        WILD / "wordpress-nginx-pothi/sites-available/nginx-varnish-nginx.conf", tmp_path / "v", capsys
    )
    assert code == 1 and "nginx-varnish-nginx.conf:18 takes over its 418 (the gateway follows none)" in stderr
