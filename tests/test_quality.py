"""The code stays typed (mypy --strict) and lint-clean (ruff): CI fails otherwise."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.helpers import ROOT


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT)


@pytest.mark.skipif(shutil.which("ruff") is None and run("ruff", "--version").returncode != 0, reason="ruff missing")
def test_ruff():
    result = run("ruff", "check", "gateway", "tests", "scripts")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict():
    result = run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
