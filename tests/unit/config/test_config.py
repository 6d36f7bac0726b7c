"""Configuration validation: a corpus of broken files, each with the exact errors it must produce."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config.units import parse_duration_ms, parse_rate, parse_size
from gateway.errors import ConfigErrors
from gateway.plan import load_config
from tests.support.paths import ROOT

CASES = sorted((Path(__file__).parent / "config_cases").glob("*.yaml"))


def expected_errors(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    return [f"{path}:{line.split('# expect: ', 1)[1]}" for line in lines if line.startswith("# expect: ")]


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_broken_file_reports_every_error_with_line_and_key(case: Path):
    with pytest.raises(ConfigErrors) as info:
        load_config(str(case))
    assert [str(e) for e in info.value.errors] == expected_errors(case)


def test_check_command_prints_errors_and_exits_1_without_traceback():
    case = Path(__file__).parent / "config_cases" / "limit_directives.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "check", "-c", str(case)], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    printed = [line.removeprefix("gateway: ") for line in proc.stderr.splitlines()]
    assert printed == expected_errors(case)


def test_check_command_accepts_the_shipped_config():
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "check", "-c", "conf/limits.yaml"], capture_output=True, text=True, cwd=ROOT
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "ok\n", "")


def test_missing_file_is_a_clean_error():
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "run", "-c", "/nonexistent.yaml"], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 1
    assert proc.stderr == "gateway: /nonexistent.yaml: (top level): cannot read file: No such file or directory\n"


def test_version():
    proc = subprocess.run([sys.executable, "-m", "gateway", "--version"], capture_output=True, text=True, cwd=ROOT)
    assert proc.stdout.startswith("gateway ")


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("250ms", 250),
        ("5s", 5000),
        ("10m", 600_000),
        ("1h", 3_600_000),
        ("1d", 86_400_000),
        ("1h30m", 5_400_000),
        (2, 2000),
        ("1.5s", 1500),
        ("0", 0),
    ],
)
def test_durations(text, ms):
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("bad", ["5 sec", "-1s", "s", "", "1y", True, None, [1]])
def test_bad_durations(bad):
    with pytest.raises(ValueError):
        parse_duration_ms(bad)


@pytest.mark.parametrize(
    ("text", "size"), [("512k", 524288), ("10m", 10485760), ("1g", 1 << 30), (100, 100), ("1M", 1 << 20)]
)
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize(
    ("text", "rate_m"),
    [
        ("1r/s", 1000),
        ("2r/s", 2000),
        ("1000r/s", 1_000_000),
        ("1r/m", 16),
        ("7r/m", 116),
        ("30r/m", 500),
        ("100r/m", 1666),
        ("5", 5000),
        (5, 5000),
    ],
)
def test_rates_are_truncated_like_nginx(text, rate_m):
    assert parse_rate(text).rate_m == rate_m


@pytest.mark.parametrize("bad", ["1.5r/s", "0r/s", "10r/h", "5r/S", "r/s", "-1r/s", "", "1e3r/s"])
def test_rates_nginx_rejects(bad):
    with pytest.raises(ValueError, match="invalid rate"):
        parse_rate(bad)


def test_log_templates_are_checked_and_every_variable_has_a_value():
    from gateway.logs.access import _GETTERS
    from gateway.logs.formats import VARIABLES
    from gateway.plan import load_config_text

    assert set(_GETTERS) == VARIABLES  # what check accepts is exactly what the log can print
    base = "upstreams: {app: {servers: [127.0.0.1:9]}}\nroutes: [{location: /, upstream: app}]\n"
    load_config_text(base + 'log: {format: "$remote_addr $http_x_trace $limit_req_status"}')
    with pytest.raises(ConfigErrors, match=r'log.format: unknown log variable "\$remote_adr"'):
        load_config_text(base + 'log: {format: "$remote_adr $status"}')
