"""The documentation builds as a site: ``mkdocs build --strict`` fails on a broken link, a
missing anchor or a page left out of the navigation, and so does this test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mkdocs_build_strict_passes(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    assert (tmp_path / "site" / "configuration" / "index.html").is_file()


def test_every_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    missing = [page for page in pages if f": {page}" not in nav]
    assert not missing, f"pages not in mkdocs.yml's nav: {missing}"


def test_the_readme_stays_a_readme() -> None:
    """The README is for users: the reference, the design and the benchmarks live in docs/."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move the detail to docs/"
