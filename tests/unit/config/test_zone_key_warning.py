"""``gateway check`` on a zone key with no variable: a warning with file:line, exit 0.

``key: binary_remote_addr`` (the ``$`` forgotten) puts every client in one bucket; ``key: global``
is how a zone says that one bucket is meant, and it passes without a word.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def check(tmp_path: Path, zones: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "limits.yaml"
    config.write_text(
        "listen: 127.0.0.1:8080\n"
        "zones:\n"
        f"{zones}"
        "upstreams:\n"
        "  app:\n"
        "    servers: [127.0.0.1:9000]\n"
        "routes:\n"
        "  - location: /\n"
        "    upstream: app\n"
    )
    return subprocess.run(
        [sys.executable, "-m", "gateway", "check", "-c", str(config)], capture_output=True, text=True, cwd=ROOT
    )


def test_a_forgotten_dollar_is_a_warning_at_its_line(tmp_path: Path) -> None:
    proc = check(tmp_path, "  per_ip:\n    type: req\n    key: binary_remote_addr\n    rate: 10r/s\n")
    assert (proc.returncode, proc.stdout) == (0, "ok\n")
    assert proc.stderr.splitlines() == [
        f"gateway: warning: {tmp_path / 'limits.yaml'}:5:10: zones.per_ip.key: key 'binary_remote_addr' has no "
        'variable, so every client shares one bucket; did you mean "$binary_remote_addr"? '
        "write key: global if one bucket for all is meant"
    ]


def test_any_constant_key_is_a_warning_without_a_guess(tmp_path: Path) -> None:
    proc = check(tmp_path, "  conns:\n    type: conn\n    key: 'tenant-a'\n")
    assert proc.returncode == 0
    assert "zones.conns.key: key 'tenant-a' has no variable, so every client shares one bucket; write" in proc.stderr
    assert "did you mean" not in proc.stderr


def test_a_header_name_without_its_dollar_is_recognised(tmp_path: Path) -> None:
    proc = check(tmp_path, "  quota:\n    type: count\n    key: http_x_api_key\n    limit: 10\n    window: 1m\n")
    assert proc.returncode == 0
    assert 'did you mean "$http_x_api_key"?' in proc.stderr


def test_key_global_is_one_bucket_on_purpose(tmp_path: Path) -> None:
    proc = check(tmp_path, "  site:\n    type: req\n    key: global\n    rate: 100r/s\n")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "ok\n", "")


def test_keys_with_a_variable_pass_quietly(tmp_path: Path) -> None:
    proc = check(
        tmp_path,
        "  per_ip:\n    type: req\n    key: $binary_remote_addr\n    rate: 10r/s\n"
        "  per_path:\n    type: req\n    key: 'api:$uri'\n    rate: 10r/s\n",
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "ok\n", "")
