"""``listen ... proxy_protocol`` and ``real_ip.header: proxy_protocol``: how they are written in the
gateway's config, on the command line and in an imported nginx configuration."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.config.overrides import Overrides
from gateway.config.servers import ListenSpec
from gateway.errors import ConfigErrors
from gateway.plan.load import load_config_text
from tests.support.paths import ROOT

ROUTES = "routes:\n  - {location: /, return: {code: 200}}\nadmin: {listen: 'off'}\n"


def test_listen_flags_in_both_spellings() -> None:
    config = load_config_text(
        "listen:\n"
        '  - "127.0.0.1:8080 proxy_protocol"\n'
        "  - {address: 127.0.0.1:9000, proxy_protocol: true}\n"
        "  - 127.0.0.1:9001\n"
        "real_ip: {from: [10.0.0.0/8], header: proxy_protocol}\n" + ROUTES
    )
    assert config.spec.listen == (
        ListenSpec("127.0.0.1", 8080, False, True),
        ListenSpec("127.0.0.1", 9000, False, True),
        ListenSpec("127.0.0.1", 9001, False, False),
    )
    assert str(config.spec.listen[0]) == "127.0.0.1:8080 proxy_protocol"
    assert config.realip.proxy_protocol


@pytest.mark.parametrize("entry", ['"127.0.0.1:8080 proxy"', '"127.0.0.1:8080 ssl ssl"'])
def test_unknown_or_repeated_listen_words_are_errors(entry: str) -> None:
    with pytest.raises(ConfigErrors, match="listen parameter"):
        load_config_text(f"listen: {entry}\n" + ROUTES)


def test_command_line_listen_takes_proxy_protocol() -> None:
    overrides = Overrides.parse(["127.0.0.1:8080 ssl proxy_protocol"], [], None)
    assert overrides.listen == (ListenSpec("127.0.0.1", 8080, True, True),)


def test_import_nginx_keeps_proxy_protocol(tmp_path: Path) -> None:
    conf = tmp_path / "nginx.conf"
    conf.write_text(
        "http { set_real_ip_from 10.0.0.0/8; real_ip_header proxy_protocol;\n"
        "  server { listen 8080 proxy_protocol; location / { proxy_pass http://127.0.0.1:9000; } } }\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "import-nginx", str(conf)],
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=30,
    )
    doc = yaml.safe_load(result.stdout)
    assert doc["real_ip"]["header"] == "proxy_protocol"
    assert "0.0.0.0:8080 proxy_protocol" in str(doc["listen"]), result.stdout
