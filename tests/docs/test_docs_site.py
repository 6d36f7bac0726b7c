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


def test_every_path_and_module_the_docs_name_exists() -> None:
    """A file or module named in the README, CONTRIBUTING or docs/ is one the tree has: a page
    that describes the layout cannot drift from it unnoticed."""
    import importlib.util
    import re

    texts = {p: p.read_text() for p in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md")]}
    missing = []
    for page, text in texts.items():
        for path in set(re.findall(r"(?<![\w/.-])((?:gateway|scripts|tests|conf|contrib)/[\w./-]*\w)(?![\w*<])", text)):
            if not (ROOT / path).exists():
                missing.append(f"{page.name}: {path}")
        for module in set(re.findall(r"(?<![\w./])(gateway(?:\.[a-z_]+)+)(?![\w*])", text)):
            if module.rsplit(".", 1)[1] in ("pid", "yaml", "log", "token", "toml", "service", "conf"):
                continue  # a file name, not a module
            if importlib.util.find_spec(module.rsplit(".", 1)[0]) is None:
                missing.append(f"{page.name}: {module}")
                continue
            if importlib.util.find_spec(module) is None and not _attribute_exists(module):
                missing.append(f"{page.name}: {module}")
    assert not missing, "named in the docs but not in the tree:\n" + "\n".join(sorted(missing))


def _attribute_exists(dotted: str) -> bool:
    import importlib

    module, _, name = dotted.rpartition(".")
    try:
        return hasattr(importlib.import_module(module), name)
    except ImportError:
        return False
