"""A configuration file cannot make loading slow, huge or crash, and absurd numbers are errors.

Each test is an attack on the loader kept as a test: nested aliases (a "billion
laughs"), deep nesting, a self-referencing alias, an endless file, unprintable
bytes, numbers Python refuses to build, and numbers beyond what nginx and our
arithmetic keep exact.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.config.compose import MAX_DEPTH, MAX_VALUES
from gateway.config.source import MAX_ERRORS, MAX_FILE_BYTES, parse_yaml, read_document
from gateway.config.units import MAX_RATE, parse_rate, parse_size
from gateway.errors import ConfigErrors
from gateway.plan import load_config_text
from tests.support.paths import ROOT

BASE = "upstreams: {app: {servers: [127.0.0.1:9]}}\nroutes: [{location: /, upstream: app}]\n"


def alias_bomb(levels: int) -> str:
    """``levels`` lines, each a list of ten aliases to the line above: 10**levels values."""
    names = "abcdefghij"
    lines = [f'{names[0]}: &{names[0]} ["x","x","x","x","x","x","x","x","x","x"]']
    for i in range(1, levels):
        lines.append(f"{names[i]}: &{names[i]} [{','.join(['*' + names[i - 1]] * 10)}]")
    return "\n".join(lines) + f"\nroutes: *{names[levels - 1]}\n"


# Runs `gateway check` and prints its own peak RSS. Linux carries a parent's high-water mark into
# a forked child's ru_maxrss, so the command is started from this small launcher, not from pytest.
_LAUNCHER = """
import os, subprocess, sys
proc = subprocess.Popen([sys.executable, "-m", "gateway", "check", "-c", sys.argv[1]])
_, status, usage = os.wait4(proc.pid, 0)
print(usage.ru_maxrss, file=sys.stderr)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_check(path: Path) -> tuple[subprocess.CompletedProcess[str], float, int]:
    """``gateway check`` through the real CLI: the result, its wall time and its peak RSS in KiB."""
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _LAUNCHER, str(path)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    elapsed = time.perf_counter() - started
    *lines, rss = proc.stderr.splitlines(keepends=True)
    proc.stderr = "".join(lines)
    return proc, elapsed, int(rss)


def errors_of(text: str, file: str = "t.yaml") -> list[str]:
    with pytest.raises(ConfigErrors) as info:
        load_config_text(text, file)
    return [str(e) for e in info.value.errors]


def count_values(data: Any) -> int:
    if isinstance(data, dict):
        return 1 + sum(count_values(v) for v in data.values())
    if isinstance(data, list):
        return 1 + sum(count_values(v) for v in data)
    return 1


# -- 1. alias expansion, node count, depth, size ----------------------------------------------


@pytest.mark.timing
def test_a_7_level_alias_bomb_is_refused_by_check_at_once_and_in_little_memory(tmp_path: Path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb(7))
    _, baseline, _ = run_check(ROOT / "conf" / "limits.yaml")  # interpreter start and imports
    proc, elapsed, rss_kib = run_check(bomb)
    print(
        f"\ncheck of a 7-level alias bomb: {elapsed:.3f}s, peak RSS {rss_kib // 1024} MiB (valid file: {baseline:.3f}s)"
    )
    assert proc.returncode == 1
    assert proc.stderr == (
        f"gateway: {bomb}:5:29: (top level): the document expands to more than {MAX_VALUES} values (nested aliases?)\n"
    )
    assert elapsed < max(1.0, baseline + 0.5)  # was 20 s
    assert rss_kib < 100 * 1024  # was 1.6 GB


def test_the_bound_counts_each_pass_through_an_alias_exactly():
    # root mapping + `a` (1 + 99 items) + `b` (1 + 998 aliases of 100 values) + `c` (1 + m items)
    def document(m: int) -> str:
        return (
            "a: &a ["
            + ",".join(["1"] * 99)
            + "]\nb: ["
            + ",".join(["*a"] * 998)
            + "]\nc: ["
            + ",".join(["2"] * m)
            + "]\n"
        )

    at_bound = document(MAX_VALUES - 1 - 100 - 1 - 998 * 100 - 1)
    assert count_values(parse_yaml(at_bound, "t.yaml").data) == MAX_VALUES
    with pytest.raises(ConfigErrors) as info:
        parse_yaml(document(MAX_VALUES - 1 - 100 - 1 - 998 * 100), "t.yaml")
    last_item_column = len("c: [" + "2," * (MAX_VALUES - 1 - 100 - 1 - 998 * 100 - 1)) + 1
    assert [str(e) for e in info.value.errors] == [
        f"t.yaml:3:{last_item_column}: (top level): the document expands to more than {MAX_VALUES} values"
    ]


def test_a_6_level_bomb_stops_at_the_alias_that_crosses_the_bound():
    assert errors_of(alias_bomb(6)) == [
        f"t.yaml:5:29: (top level): the document expands to more than {MAX_VALUES} values (nested aliases?)"
    ]


def test_deep_nesting_is_an_error_not_a_recursion_crash(tmp_path: Path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("routes: " + "[" * 100 + "]" * 100 + "\n")
    proc, _, _ = run_check(deep)
    assert proc.returncode == 1
    assert (
        proc.stderr
        == f"gateway: {deep}:1:{8 + MAX_DEPTH}: (top level): the document nests deeper than {MAX_DEPTH} levels\n"
    )
    # Far deeper: newer libyaml stops at its own bound (1,000 flow levels) while its scanner
    # looks ahead, before the composer reaches ours; the error says the same, where libyaml stopped.
    deep.write_text("routes: " + "[" * 5000 + "]" * 5000 + "\n")
    proc, _, _ = run_check(deep)
    assert proc.returncode == 1
    found = re.fullmatch(rf"gateway: {re.escape(str(deep))}:1:(\d+): \(top level\): (.*)\n", proc.stderr)
    assert found, proc.stderr
    assert found.group(2) == f"the document nests deeper than {MAX_DEPTH} levels"
    assert 8 + MAX_DEPTH <= int(found.group(1)) <= 8 + 1001


def test_nesting_through_aliases_counts_too():
    inner = "[" * 40 + "1" + "]" * 40
    text = f"a: &a {inner}\nroutes: " + "[" * 30 + "*a" + "]" * 30 + "\n"
    assert errors_of(text) == [
        f"t.yaml:2:39: (top level): the document nests deeper than {MAX_DEPTH} levels (nested aliases?)"
    ]


def test_an_alias_inside_its_own_anchor_is_undefined_not_an_endless_loop():
    assert errors_of("routes: &a [*a]\n") == ["t.yaml:1:13: (top level): YAML syntax error: found undefined alias 'a'"]
    assert errors_of("a: &a {b: *a}\nroutes: []\n") == [
        "t.yaml:1:11: (top level): YAML syntax error: found undefined alias 'a'"
    ]


def test_a_file_over_the_size_cap_is_refused_before_parsing(tmp_path: Path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"# padding\n" * (MAX_FILE_BYTES // 10) + b"routes: []\n")
    started = time.perf_counter()
    with pytest.raises(ConfigErrors) as info:
        read_document(str(big))
    assert time.perf_counter() - started < 0.5
    assert [str(e) for e in info.value.errors] == [
        f"{big}: (top level): the file is larger than 4 MiB; refusing to parse it"
    ]


def test_an_endless_file_is_refused_without_reading_it_all():
    with pytest.raises(ConfigErrors, match=r"not a regular file \(a character device\)"):
        read_document("/dev/zero")


def test_a_file_just_under_the_cap_still_loads():
    text = BASE + "#" * (MAX_FILE_BYTES - len(BASE) - 1) + "\n"
    assert len(text) == MAX_FILE_BYTES
    assert load_config_text(text).spec.routes[0].location.value == "/"


# -- 2. unprintable characters and bad encodings by line:column -------------------------------


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ("workers: 1\nroutes: [\x00]\n", "2:10", "#x0000 (NUL)"),
        ("workers: 1\n# é è \x07\n", "2:7", "#x0007"),
        ("a: 1\r\nb: \x1b[31m\n", "2:4", "#x001b (ESC)"),
        ("a: 'x\x7f'\n", "1:6", "#x007f (DEL)"),
        ("a: \ud800\n", "1:4", "#xd800"),
    ],
)
def test_unprintable_characters_are_reported_by_line_and_column(text: str, where: str, what: str):
    assert errors_of(text) == [
        f"t.yaml:{where}: (top level): unacceptable character {what}: YAML allows no control characters"
    ]


def test_a_nul_byte_in_a_file_through_check(tmp_path: Path):
    path = tmp_path / "nul.yaml"
    path.write_bytes(b"listen: 127.0.0.1:8080\nroutes:\n  - location: /\0\n")
    proc, _, _ = run_check(path)
    assert proc.returncode == 1
    assert proc.stderr == (
        f"gateway: {path}:3:16: (top level): unacceptable character #x0000 (NUL): YAML allows no control characters\n"
    )


def test_invalid_utf8_is_reported_by_line_and_column(tmp_path: Path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"listen: 127.0.0.1:8080\n# caf\xe9\n")
    with pytest.raises(ConfigErrors) as info:
        read_document(str(path))
    assert [str(e) for e in info.value.errors] == [
        f"{path}:2:6: (top level): file is not UTF-8: invalid continuation byte"
    ]


# -- values Python refuses to build are errors, not tracebacks ---------------------------------


def test_numbers_and_dates_python_cannot_build_are_errors(tmp_path: Path):
    path = tmp_path / "values.yaml"
    path.write_text(f"workers: {'9' * 5000}\nshutdown_timeout: 2024-13-45\nroutes: []\n")
    proc, _, _ = run_check(path)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        f"gateway: {path}:1:10: workers: invalid value '{'9' * 37}...': too many digits",
        f"gateway: {path}:2:19: shutdown_timeout: invalid value '2024-13-45': month must be in 1..12",
    ]


# -- 3. numbers beyond what nginx and our arithmetic accept ------------------------------------


def test_the_largest_accepted_values_load_and_the_benchmark_config_stays_valid():
    text = BASE.replace("routes: [{location: /, upstream: app}]", "") + (
        "zones:\n"
        f"  a: {{type: req, key: $binary_remote_addr, rate: {MAX_RATE}r/s, size: 64g}}\n"
        f"  b: {{type: req, key: $binary_remote_addr, rate: {MAX_RATE}r/m}}\n"
        "  ip: {type: req, key: $binary_remote_addr, rate: 1000000r/s}\n"
        "routes:\n"
        "  - location: /\n"
        "    upstream: app\n"
        "    client_max_body_size: 1024g\n"
        f"    limit_req: [{{zone: a, burst: {MAX_RATE}, delay: {MAX_RATE}}}, {{zone: b}}]\n"
        "  - location: /bench\n"
        "    upstream: app\n"
        "    limit_req: [{zone: ip, burst: 1000000, nodelay: true}]\n"
    )
    config = load_config_text(text)
    assert config.spec.zones["a"].size == 64 * 1024**3
    assert config.spec.zones["a"].rate is not None and config.spec.zones["a"].rate.rate_m == MAX_RATE * 1000
    assert config.spec.zones["a"].rate.rate_m < 2**42  # the embedded store's excess field
    assert config.routes[0].client_max_body_size == 1024**4
    assert config.spec.routes[0].settings.limit_req is not None
    assert config.spec.routes[0].settings.limit_req[0].burst * 1000 < 2**42


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("99999999999999999999r/s", "rate '99999999999999999999r/s' is too large: at most 2147483647r/s"),
        ("2147483648r/m", "rate '2147483648r/m' is too large: at most 2147483647r/m"),
        ("1" * 5000 + "r/s", "is too large: at most 2147483647r/s"),
        (2**31, "rate 2147483648 is too large: at most 2147483647r/s"),
        ("٣r/s", "invalid rate"),
        ("²r/s", "invalid rate"),
    ],
)
def test_rates_beyond_the_cap_are_refused(text: object, message: str):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("*", r"\*")):
        parse_rate(text)


@pytest.mark.parametrize(
    ("text", "maximum", "message"),
    [
        ("1000000g", 64 * 1024**3, "size '1000000g' is too large: at most 64g"),
        ("65g", 64 * 1024**3, "size '65g' is too large: at most 64g"),
        ("1025g", 1024**4, "size '1025g' is too large: at most 1024g"),
        (2**40 + 1, 1024**4, f"size {2**40 + 1} is too large: at most 1024g"),
        ("9" * 5000, 1024**4, "is too large: at most 1024g"),
        ("٣k", 1024**4, "invalid size"),
    ],
)
def test_sizes_beyond_the_cap_are_refused(text: object, maximum: int, message: str):
    with pytest.raises(ValueError, match=message):
        parse_size(text, maximum)


def test_rates_take_leading_zeros_like_ngx_atoi():
    assert parse_rate("0000000000000000000001r/s").count == 1
    assert parse_rate(f"00{MAX_RATE}r/m").count == MAX_RATE


# -- a file of many mistakes ------------------------------------------------------------------


def test_errors_stop_after_a_hundred_and_say_so():
    unknown = "".join(f"rout{i}: 1\n" for i in range(20_000))
    errors = errors_of("routes: []\n" + unknown)
    assert len(errors) == MAX_ERRORS + 1
    assert errors[-1] == f"t.yaml:102:1: rout100: more than {MAX_ERRORS} errors: the rest are not shown"
    duplicates = "".join("a: 1\n" for _ in range(20_000))
    errors = errors_of(duplicates)
    assert len(errors) == MAX_ERRORS + 1
    assert errors[-1] == f"t.yaml:102:1: a: more than {MAX_ERRORS} errors: the rest are not shown"
