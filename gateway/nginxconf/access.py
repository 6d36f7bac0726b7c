"""Who the client is and whether it may enter: ``set_real_ip_from``/``real_ip_*`` and ``allow``/``deny``.

They become ``real_ip:`` and ``access.deny``, which the gateway applies to every route.
(The real IP settings of several servers become the one ``real_ip:`` when every server
says the same: see ``Context.shared_settings``.) An ``allow``/``deny`` list becomes ``access.deny`` when
it is a list of denies (optionally ending in ``allow all``), which the first match of
nginx and the gateway's deny read alike.
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
        self.real_ip.setdefault("from", []).extend(a for a in d.args if a not in self.real_ip.get("from", []))

    def real_ip_header(self, d: Directive) -> None:
        self.real_ip["header"] = d.args[0]  # proxy_protocol too: listen ... proxy_protocol

    def real_ip_recursive(self, d: Directive) -> None:
        self.real_ip["recursive"] = d.args[0] == "on"

    def rules(self, rules: list[Directive], global_ok: bool) -> bool:
        """nginx's first-match allow/deny list to access.deny, when the meaning is the same (True)."""
        ends_open = rules[-1].name == "allow" and rules[-1].args == ["all"]
        denies = rules[:-1] if ends_open else rules
        exact = global_ok and all(r.name == "deny" and r.args and r.args[0] != "all" for r in denies)
        if not exact:
            return False
        for r in denies:
            if r.args[0] not in self.deny:
                self.deny.append(r.args[0])
        if ends_open:
            self.result.same_here(rules[-1])
        return True
