"""The Redis scripts, read from ``scripts/lua`` (shipped in the package as ``gateway.lua``).

The scripts are package data: they are read with importlib.resources, so an editable
install, a wheel in site-packages and a zip import all find them the same way.

A line ``--#include other.lua`` is replaced by the part of ``other.lua`` above its
``--#entry`` line (its functions, with its own includes resolved; each file once), so
the per-key arithmetic is written once and the standalone scripts stay loadable as they
are, by OpenResty nodes too.
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources

from gateway.errors import ScriptsMissing

PACKAGE = "gateway.lua"
ENTRY = "--#entry"
INCLUDE = "--#include "
SCRIPTS = ("batch.lua", "undo.lua")  # the ones the store sends to Redis


def read(name: str) -> str:
    """One script file as installed, includes not resolved."""
    try:
        return resources.files(PACKAGE).joinpath(name).read_text(encoding="utf-8")
    except (ModuleNotFoundError, OSError) as exc:
        raise ScriptsMissing(
            f"cannot load the Redis script {name} from the {PACKAGE} package ({type(exc).__name__}: {exc}); "
            "the gateway is installed without its Lua scripts: reinstall it from a wheel or a checkout"
        ) from None


@cache
def source(name: str) -> str:
    """The script as sent to Redis, with includes resolved (each file once, includes of includes too)."""
    return _resolve(read(name), set()) + "\n"


def _resolve(text: str, seen: set[str]) -> str:
    lines = []
    for line in text.splitlines():
        if line.startswith(INCLUDE):
            included = line[len(INCLUDE) :].strip()
            if included not in seen:
                seen.add(included)
                library = read(included).split(ENTRY, 1)[0]
                lines.append(_resolve(library, seen).rstrip())
        else:
            lines.append(line)
    return "\n".join(lines)


@cache
def sha1(name: str) -> str:
    return hashlib.sha1(source(name).encode()).hexdigest()


def require_all() -> None:
    """Read every script the store uses, or raise ScriptsMissing: called before a Redis-backed start."""
    for name in SCRIPTS:
        source(name)
