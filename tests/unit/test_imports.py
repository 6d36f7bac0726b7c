"""The package tree has no import cycles: every module imports first, and packages form no cycle.

The first test imports each ``gateway.*`` module first, each in a fresh interpreter, so a cycle
hidden by the order the entry points happen to import things still fails. The second builds the
graph of imports between packages (``gateway.<package>``) from the source and fails on a cycle
that is not in ``ALLOWED``, each entry of which says why it is there.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gateway"

# (importer package, imported package): why the edge is there although it closes a cycle.
ALLOWED: dict[tuple[str, str], str] = {
    ("gateway.logs", "gateway.metrics"): "the access logger is aiohttp's per-response hook, the one place every "
    "response passes (the edge's own 400s included), so it counts responses for /metrics; metrics "
    "in turn writes to the error log",
}


def modules() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts))
    return names


def test_every_module_imports_first_in_a_fresh_interpreter() -> None:
    def first_import(name: str) -> str | None:
        result = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, cwd=ROOT)
        return f"{name}: {result.stderr.strip().splitlines()[-1]}" if result.returncode else None

    with ThreadPoolExecutor(max_workers=4) as pool:
        failures = [line for line in pool.map(first_import, modules()) if line]
    assert not failures, "\n".join(failures)


def package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


def runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """The nodes outside ``if TYPE_CHECKING:`` blocks: an annotation is not an import."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(inner) for inner in ast.walk(node))
    return [node for node in ast.walk(tree) if id(node) not in hidden]


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if (PACKAGE / Path(*rel.split(".")[1:2])).is_dir() is False and rel.count(".") == 1:
            source = rel  # a top-level module is its own node
        else:
            source = package_of(rel)
        for node in runtime_nodes(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "gateway":
                    targets = [f"gateway.{alias.name}" for alias in node.names]
                else:
                    targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                if not target.startswith("gateway.") or target == "gateway.__version__":
                    continue
                dest = package_of(target)
                if dest != source:
                    graph.setdefault(source, set()).add(dest)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_between_packages() -> None:
    graph = package_graph()
    for (src, dst), _why in ALLOWED.items():
        graph.get(src, set()).discard(dst)
    problems = []
    for component in cycles(graph):
        edges = sorted(f"{a} -> {b}" for a in component for b in graph.get(a, ()) if b in component)
        problems.append("cycle among " + ", ".join(component) + ":\n    " + "\n    ".join(edges))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("edge", sorted(ALLOWED))
def test_every_allowed_edge_still_exists(edge: tuple[str, str]) -> None:
    assert edge[1] in package_graph().get(edge[0], set()), f"{edge} is allowed but no longer imported: drop it"


def test_package_faces_only_re_export() -> None:
    """Each ``__init__.py`` holds a docstring, imports and ``__all__`` (the top package also its
    ``__version__``): where the code of a package lives is in the tree, never in its face."""
    problems = []
    for path in sorted(PACKAGE.rglob("__init__.py")):
        tree = ast.parse(path.read_text(), str(path))
        for i, node in enumerate(tree.body):
            if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # the docstring
            if isinstance(node, ast.ImportFrom | ast.Import):
                continue
            if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] in (
                ["__all__"],
                ["__version__"],
            ):
                continue
            problems.append(f"{path.relative_to(ROOT)}:{node.lineno}: {type(node).__name__}")
        if not (tree.body and isinstance(tree.body[0], ast.Expr)):
            problems.append(f"{path.relative_to(ROOT)}: no docstring")
    assert not problems, "\n".join(problems)
