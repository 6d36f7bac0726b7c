"""The Redis scripts, read from ``scripts/lua`` (shipped in the package as ``gateway.lua``).

A line ``--#include other.lua`` is replaced by the part of ``other.lua`` above its
``--#entry`` line (its functions), so the per-key arithmetic is written once and the
standalone scripts stay loadable as they are, by OpenResty nodes too.
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources
from pathlib import Path

ENTRY = "--#entry"
INCLUDE = "--#include "


def script_dir() -> Path:
    try:
        path = Path(str(resources.files("gateway.lua")))
        if (path / "limit_req.lua").is_file():
            return path
    except ModuleNotFoundError:
        pass
    return Path(__file__).resolve().parent.parent.parent / "scripts" / "lua"  # a source checkout


@cache
def source(name: str) -> str:
    """The script as sent to Redis, with includes resolved."""
    lines = []
    for line in (script_dir() / name).read_text(encoding="utf-8").splitlines():
        if line.startswith(INCLUDE):
            included = (script_dir() / line[len(INCLUDE) :].strip()).read_text(encoding="utf-8")
            library = included.split(ENTRY, 1)[0]
            lines.append(library.rstrip())
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


@cache
def sha1(name: str) -> str:
    return hashlib.sha1(source(name).encode()).hexdigest()
