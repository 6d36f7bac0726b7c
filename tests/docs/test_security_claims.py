"""docs/security.md and the README's Security section name the test behind each claim: every
named test exists, and every claim of the page names at least one."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from tests.support.paths import ROOT

NODE = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
PAGES = [ROOT / "docs" / "security.md", ROOT / "README.md"]


@cache
def functions_of(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text())
    return frozenset(
        node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    )


def claims(text: str) -> list[str]:
    """The bullets of the sections that say what holds (up to the page's next level-2 heading)."""
    start = text.find("## What holds") if "## What holds" in text else text.find("## Security")
    assert start >= 0, "no section that says what holds"
    end = text.find("\n## ", start + 1)
    section = text[start : end if end > 0 else None]
    return [b for b in re.split(r"\n(?=\* )", section) if b.startswith("* ")]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_named_test_exists(page: Path) -> None:
    missing = [
        f"{path}::{name}"
        for path, name in NODE.findall(page.read_text())
        if not (ROOT / path).exists() or name not in functions_of(ROOT / path)
    ]
    assert not missing, f"{page.name} names tests that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_claim_names_its_test(page: Path) -> None:
    bare = [c.splitlines()[0] for c in claims(page.read_text()) if not NODE.search(c) and "security.md" not in c]
    assert not bare, f"{page.name}: claims without a test: {bare}"
