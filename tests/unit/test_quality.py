"""The code stays typed (mypy --strict) and lint-clean (ruff): CI fails otherwise."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import ROOT


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT)


def test_ruff():
    result = run("ruff", "check", "gateway", "tests", "scripts")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict():
    result = run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
