"""nginx's location order written the obvious way, and the 2,000-location benchmark shape.

``ReferenceTable`` is the matcher ``gateway.http.routing.LocationTable`` replaced: every
prefix and every regex tried in turn. The routing tests check the compiled table against it,
and scripts/bench_routing.py times the two against each other on ``large_locations``.
"""

from __future__ import annotations

import random
from typing import Any


class ReferenceTable:
    """nginx's order, written the obvious way: every prefix and every regex tried in turn.

    The compiled ``LocationTable`` must agree with it on every URI.
    """

    def __init__(self, entries: Any) -> None:
        self.exact: dict[str, Any] = {}
        self.prefixes: list[tuple[str, bool, Any]] = []
        self.regexes: list[tuple[Any, Any]] = []
        for location, item in entries:
            if location.kind == "exact":
                self.exact.setdefault(location.value, item)
            elif location.kind in ("prefix", "prefix_noregex"):
                self.prefixes.append((location.value, location.kind == "prefix_noregex", item))
            else:
                self.regexes.append((location.pattern, item))
        self.prefixes.sort(key=lambda p: len(p[0]), reverse=True)
        self.slashed = {v[:-1] for v, _, _ in self.prefixes if v.endswith("/") and len(v) > 1}

    def match(self, uri: str) -> tuple[Any, str | None]:
        if uri in self.exact:
            return (self.exact[uri], None)
        best = next((p for p in self.prefixes if uri.startswith(p[0])), None)
        if uri in self.slashed:
            return (None, uri + "/")
        if best is not None and best[1]:
            return (best[2], None)
        for pattern, item in self.regexes:
            if pattern.search(uri):
                return (item, None)
        return (best[2] if best is not None else None, None)


def large_locations(rng: random.Random, *, prefixes: int, regexes: int) -> list[str]:
    """The shape of the 2,000-location benchmark config: prefixes per service, regexes per suffix."""
    out = [f"/svc{i}/" if i % 3 else f"^~ /svc{i}/" for i in range(prefixes)]
    out += [f"~ \\.e{i}$" if i % 2 else f"~* ^/static/file{i}\\." for i in range(regexes)]
    rng.shuffle(out)
    return ["/", *out]
