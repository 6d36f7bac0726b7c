"""The zone types of ``limits:`` by name: every module of ``gateway.limits`` that defines ``ZONE_TYPE``.

Adding a type is adding its module here (with its ``ZONE_TYPE`` record, ``gateway.limits.algo``),
its Lua script in ``scripts/lua/`` and its keys in the config schema: the plan, the three
stores, request.lua's dispatch, the inspect readers and the status variables find it here.

The modules are found on first use (not at import, so that a module of the package may import
this one), in name order, and looked up once per compiled limit, never per request.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from functools import cache
from types import MappingProxyType

from gateway.limits.algo import AlgoType

PACKAGE = "gateway.limits"


@cache
def algo_types() -> Mapping[str, AlgoType]:
    """Every zone type of ``limits:``, by name, in name order."""
    package = importlib.import_module(PACKAGE)
    found: dict[str, AlgoType] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        record = getattr(importlib.import_module(f"{PACKAGE}.{info.name}"), "ZONE_TYPE", None)
        if isinstance(record, AlgoType):
            found[record.name] = record
    codes = [record.code for record in found.values()]
    if len(set(codes)) != len(codes):
        raise RuntimeError(f"two zone types share a request.lua type code: {sorted(codes)}")
    tags = [record.undo_tag for record in found.values() if record.undo_tag]
    if len(set(tags)) != len(tags) or any(len(tag) != 1 or not tag.isalpha() or tag in "rcn" for tag in tags):
        raise RuntimeError(f"undo letters must be single letters, unique and not r, c or n: {sorted(tags)}")
    return MappingProxyType(dict(sorted(found.items())))


def algo_type(name: str) -> AlgoType:
    """The record of one zone type; KeyError for a name that is not one of ``limits:``'s types."""
    return algo_types()[name]


def status_variables() -> tuple[str, ...]:
    """The status variables of these types: ``limit_<type>_status``, in name order."""
    return tuple(f"limit_{name}_status" for name in algo_types())
