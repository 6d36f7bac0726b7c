"""Free a large tree of objects a little at a time.

Dropping the last reference to a big tree (a YAML node tree, a parsed document,
a compiled configuration of thousands of routes) frees it in one cascade of C
deallocations: 5 to 20 ms during which the thread doing it holds the GIL, so the
event loop in the other thread cannot run. ``release`` first takes a reference
to every container in the tree, then drops the root and those references one
by one, parents first: each step frees one object, and the interpreter may
switch threads between steps.
"""

from __future__ import annotations

import gc
from types import MappingProxyType

_CONTAINERS = frozenset({tuple, list, dict, set, frozenset, MappingProxyType})
_LEAVES = frozenset({str, int, float, bool, bytes, type(None)})
_OWN_MODULES = ("gateway.", "yaml.nodes")  # specs, plans and YAML nodes (their marks are leaves)
MAX_WALK = 1_000_000  # bounds the work should a tree ever reach runtime state; the rest is freed at once


def _walks_into(obj: object) -> bool:
    kind = type(obj)
    if kind in _LEAVES:
        return False
    return kind in _CONTAINERS or kind.__module__.startswith(_OWN_MODULES)


def release(holder: list[object]) -> None:
    """Empty ``holder`` and free what it held gradually (call it in a worker thread)."""
    if not holder:
        return
    order: list[object | None] = []
    seen: set[int] = set()
    pending = list(holder)
    while pending and len(order) < MAX_WALK:
        obj = pending.pop()
        if id(obj) in seen or not _walks_into(obj):
            continue
        seen.add(id(obj))
        order.append(obj)
        pending.extend(gc.get_referents(obj))
    del pending, obj
    holder.clear()
    for index in range(len(order)):
        order[index] = None  # parents come first: their children are still held here
