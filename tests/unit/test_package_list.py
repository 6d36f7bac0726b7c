"""pyproject.toml lists every package of the tree, so an installed gateway is whole.

The wheel test (tests/test_wheel_install.py) builds and installs the wheel to find out;
this check reads the list and the tree, in milliseconds, so a new package that was not
listed fails before the slow tests run.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_lists_every_package_and_nothing_else() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    tree = {".".join(path.parent.relative_to(ROOT).parts) for path in (ROOT / "gateway").rglob("__init__.py")}
    assert tree - listed == set(), "packages missing from pyproject.toml"
    assert listed - tree - {"gateway.lua"} == set(), "pyproject.toml lists packages that do not exist"
