"""The committed comparison plot is what scripts/plot_algorithms.py makes today."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import ROOT


def test_committed_svg_is_current_and_the_table_adds_up(tmp_path):
    out = tmp_path / "algorithms.svg"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "plot_algorithms.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.read_text() == (ROOT / "docs" / "algorithms.svg").read_text()
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines() if line.startswith("| ") and "zone" not in line]
    offered = int(rows[0][1])
    for name, passed, rejected, _ in rows[1:]:
        assert int(passed) + int(rejected) == offered, name
