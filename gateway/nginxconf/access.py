"""Who the client is and whether it may enter: ``set_real_ip_from``/``real_ip_*`` and ``allow``/``deny``.

The real IP settings become ``real_ip:`` (of several servers, the one ``real_ip:`` when every
server says the same: see ``Context.shared_settings``).

``allow``/``deny`` become the gateway's ``access:`` list at the level nginx has them: the
http level's at the top, a server's in that server (the top level, for a config written
as one server), a location's in its route. nginx's inheritance is the gateway's: a level
with a list of its own replaces the outer one whole. ``unix:`` rules never match a TCP
client and are left out (the level still has its own list: ``access: []`` if nothing else).
A list that cannot be translated makes its routes refuse (``guards.location_rules``).
"""

from __future__ import annotations

from gateway.config.reader import network
from gateway.nginxconf.parser import Directive
from gateway.nginxconf.result import Doc, Result


def rule_key(rules: list[Directive]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """A list's meaning, to compare two lists."""
    return tuple((r.name, tuple(r.args)) for r in rules)


class Access:
    def __init__(self, result: Result) -> None:
        self.result = result
        self.real_ip: Doc = {}
        self.http: list[Doc] | None = None  # the http level's list, translated
        self.http_rules: list[Directive] = []  # ... as written

    def real_ip_from(self, d: Directive) -> None:
        if d.args and d.args[0] == "unix:":
            self.result.skip(d, "unix: peers are not supported")
            return
        self.real_ip.setdefault("from", []).extend(a for a in d.args if a not in self.real_ip.get("from", []))

    def real_ip_header(self, d: Directive) -> None:
        self.real_ip["header"] = d.args[0]  # proxy_protocol too: listen ... proxy_protocol

    def real_ip_recursive(self, d: Directive) -> None:
        self.real_ip["recursive"] = d.args[0] == "on"

    def translate(self, rules: list[Directive]) -> list[Doc] | None:
        """nginx's first-match list as ``access:`` entries, in order; None when a rule has no
        gateway meaning (its routes must then refuse)."""
        out: list[Doc] = []
        for r in rules:
            if len(r.args) != 1:
                return None
            target = r.args[0]
            if target.startswith("unix:"):
                self.result.skip(r, "unix: peers never reach the gateway (it listens on TCP only): never matches here")
                continue
            if target != "all":
                try:
                    network(target)
                except ValueError:
                    return None
            out.append({r.name: target})
        return out
