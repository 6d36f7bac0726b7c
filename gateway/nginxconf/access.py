"""Who the client is and whether it may enter: ``set_real_ip_from``/``real_ip_*`` and ``allow``/``deny``.

They become ``real_ip:`` and ``access.deny``, which the gateway applies to every route.
"""

from __future__ import annotations

from gateway.nginxconf.parser import Directive
from gateway.nginxconf.result import Doc, Result


class Access:
    def __init__(self, result: Result) -> None:
        self.result = result
        self.real_ip: Doc = {}
        self.deny: list[str] = []

    def real_ip_from(self, d: Directive) -> None:
        if d.args and d.args[0] == "unix:":
            self.result.skip(d, "unix: peers are not supported")
            return
        self.real_ip.setdefault("from", []).extend(d.args)

    def real_ip_header(self, d: Directive) -> None:
        self.real_ip["header"] = d.args[0]  # proxy_protocol too: listen ... proxy_protocol

    def real_ip_recursive(self, d: Directive) -> None:
        self.real_ip["recursive"] = d.args[0] == "on"

    def rules(self, rules: list[Directive], global_ok: bool) -> None:
        """nginx's first-match allow/deny list to access.deny, when the meaning is the same."""
        ends_open = rules[-1].name == "allow" and rules[-1].args == ["all"]
        denies = rules[:-1] if ends_open else rules
        exact = global_ok and all(r.name == "deny" and r.args and r.args[0] != "all" for r in denies)
        if not exact:
            reason = (
                "per-server allow/deny with several servers: the gateway's access rules are global"
                if not global_ok
                else "only a list of deny rules (optionally ending in allow all) means the same: the gateway's "
                "access.allow exempts from limits instead of admitting, and it has no deny all"
            )
            for r in rules:
                self.result.skip(r, reason)
            return
        for r in denies:
            self.deny.append(r.args[0])

    def location_rules(self, rules: list[Directive]) -> None:
        for r in rules:
            self.result.skip(r, "per-location allow/deny: the gateway's access rules are global (access.allow/deny)")
