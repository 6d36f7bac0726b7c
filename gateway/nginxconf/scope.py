"""nginx's inheritance between http, server and (nested) location levels.

A simple directive (``limit_req_status``, ``client_max_body_size``...) is inherited
from the nearest level that sets it. An array directive (``limit_req``,
``limit_conn``, ``proxy_set_header``, ``add_header``) is inherited whole, and only
when the level has none of its own (``ngx_conf_merge_ptr_value`` on the array).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.nginxconf.parser import Directive

ARRAY_DIRECTIVES = ("limit_req", "limit_conn", "proxy_set_header", "add_header")


@dataclass(slots=True)
class Scope:
    parent: Scope | None = None
    simple: dict[str, Directive] = field(default_factory=dict)
    arrays: dict[str, list[Directive]] = field(default_factory=dict)

    def child(self) -> Scope:
        return Scope(parent=self)

    def set(self, d: Directive) -> None:
        if d.name in ARRAY_DIRECTIVES:
            self.arrays.setdefault(d.name, []).append(d)
        else:
            self.simple[d.name] = d

    def get(self, name: str) -> Directive | None:
        scope: Scope | None = self
        while scope is not None:
            if name in scope.simple:
                return scope.simple[name]
            scope = scope.parent
        return None

    def array(self, name: str) -> list[Directive]:
        scope: Scope | None = self
        while scope is not None:
            if name in scope.arrays:
                return scope.arrays[name]
            scope = scope.parent
        return []
