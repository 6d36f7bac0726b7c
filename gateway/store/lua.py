"""The Redis scripts, read from ``scripts/lua`` (shipped in the package as ``gateway.lua``).

The scripts are package data: they are read with importlib.resources, so an editable
install, a wheel in site-packages and a zip import all find them the same way.

A line ``--#include other.lua`` is replaced by the part of ``other.lua`` above its
``--#entry`` line (its functions, with its own includes resolved; each file once), so
the per-key arithmetic is written once and the standalone scripts stay loadable as they
are, by OpenResty nodes too.

A line ``--#algos`` is replaced by the scripts of every zone type of ``limits:``
(``gateway.limits.registry``: each record names its script and its type code) and two
tables built from them: ``ALGOS``, type code -> ``{peek, commit}`` (request.lua's dispatch),
and ``ALGO_UNDO``, undo letter -> undo function (undo.lua's). A type's script defines
``<type>_algo_peek``, ``<type>_algo_commit`` and, with an undo letter, ``<type>_algo_undo``.
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources

from gateway.errors import ScriptsMissing
from gateway.limits.registry import algo_types

PACKAGE = "gateway.lua"
ENTRY = "--#entry"
INCLUDE = "--#include "
ALGOS = "--#algos"
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
            included = _include(line[len(INCLUDE) :].strip(), seen)
            if included:
                lines.append(included)
        elif line.strip() == ALGOS:
            lines.append(_algos(seen))
        else:
            lines.append(line)
    return "\n".join(lines)


def _include(name: str, seen: set[str]) -> str:
    """The part of ``name`` above its entry line, includes resolved; "" when already included."""
    if name in seen:
        return ""
    seen.add(name)
    return _resolve(read(name).split(ENTRY, 1)[0], seen).rstrip()


def _algos(seen: set[str]) -> str:
    """The zone types' scripts and their dispatch tables (``--#algos``)."""
    types = list(algo_types().values())
    parts = [_include(t.script, seen) for t in types]
    peek = ", ".join(f"[{t.code}] = {{peek = {t.name}_algo_peek, commit = {t.name}_algo_commit}}" for t in types)
    undo = ", ".join(f"{t.undo_tag} = {t.name}_algo_undo" for t in types if t.undo_tag)
    parts += [f"local ALGOS = {{{peek}}}", f"local ALGO_UNDO = {{{undo}}}"]
    return "\n".join(part for part in parts if part)


@cache
def sha1(name: str) -> str:
    return hashlib.sha1(source(name).encode()).hexdigest()


def require_all() -> None:
    """Read every script the store uses, or raise ScriptsMissing: called before a Redis-backed start."""
    for name in SCRIPTS:
        source(name)
