"""The tests' layout holds: test modules share code only through tests/support/, and scripts/
imports nothing from tests/.

Both are read from the source (an AST walk, imports inside functions included), so an import
that only runs in one test still counts. A test module that imports another one makes the
second a library nobody sees as one; scripts/ importing tests/ ties tools to the suite.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import ROOT

TESTS = ROOT / "tests"
SUPPORT = "tests.support"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path, module: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, relative ones resolved against
    ``module`` (the file's own module name by default)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    module = module or module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            # ``from tests import x`` imports the module tests.x
            names = [f"{name}.{alias.name}" for alias in node.names] if name == "tests" else [name]
            found += [(node.lineno, each) for each in names]
    return found


def is_tests(name: str) -> bool:
    return name == "tests" or name.startswith("tests.")


def is_support(name: str) -> bool:
    return name == SUPPORT or name.startswith(SUPPORT + ".")


def test_test_modules_import_only_tests_support() -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: imports {name}"
        for path in sorted(TESTS.rglob("*.py"))
        for line, name in imported(path)
        if is_tests(name) and not is_support(name)
    ]
    assert not wrong, "only tests.support is shared between test modules (fixtures: conftest.py):\n" + "\n".join(wrong)


def test_support_imports_no_test_module() -> None:
    wrong = [
        f"{path.relative_to(ROOT)}: is a test module inside tests/support/"
        for path in sorted((TESTS / "support").rglob("test_*.py"))
    ]
    assert not wrong, "\n".join(wrong)


def test_scripts_import_nothing_from_tests() -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: imports {name}"
        for path in sorted((ROOT / "scripts").rglob("*.py"))
        for line, name in imported(path)
        if is_tests(name)
    ]
    assert not wrong, "scripts/ must not depend on the test suite:\n" + "\n".join(wrong)


def test_the_check_sees_a_bad_import(tmp_path: Path) -> None:
    # imports inside functions count, and relative ones are resolved against the module's package
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "def f():\n    from tests.e2e.test_proxy import fetch\nfrom .test_tls import ca\nimport tests.support.http\n"
    )
    names = [name for _, name in sorted(imported(sample, "tests.e2e.test_sample"))]
    assert names == ["tests.e2e.test_proxy", "tests.e2e.test_tls", "tests.support.http"]
    assert [is_support(n) for n in names] == [False, False, True]
