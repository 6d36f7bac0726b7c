"""The state one translation shares across levels, and the directives allowed at several levels.

``Context`` holds the ``Result`` and one object per directive family that keeps state
(zones, upstreams, logs, access). ``directive`` routes a directive valid at http level to
its family, and refuses it below the level where the gateway can apply it (the gateway
has one value for all routes, or one for all servers). ``setting`` puts a directive that
locations inherit into the level's ``Scope``.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.nginxconf import edge
from gateway.nginxconf.access import Access
from gateway.nginxconf.limits import Limits
from gateway.nginxconf.logs import Logs
from gateway.nginxconf.parser import Directive
from gateway.nginxconf.result import Result
from gateway.nginxconf.scope import Scope
from gateway.nginxconf.upstreams import Upstreams
from gateway.nginxconf.values import INHERITED, check_setting, same_as_nginx, unsupported
from gateway.nginxconf.variables import Variables

HTTP_ONLY = ("limit_req_zone", "limit_conn_zone", "upstream", "log_format")


class Context:
    def __init__(self, allow_open: bool = False) -> None:
        self.allow_open = allow_open  # an untranslated guard leaves its route open instead of refusing
        self.http_refusals: list[str] = []  # http-level guards not translated: every server refuses
        self.per_server: dict[str, list[Directive]] = {}  # server's where -> its global directives
        self.result = Result()
        self.limits = Limits(self.result)
        self.upstreams = Upstreams(self.result)
        self.logs = Logs(self.result)
        self.access = Access(self.result)
        self.variables = Variables(self.result)
        self.error_pages: dict[str, Directive] = {}  # code -> its error_page, in the server being read
        self.http_error_pages: dict[str, Directive] = {}  # those of the http level
        self.assigned: dict[str, Directive] = {}  # the variables a set of the server being read assigns

    def skip(self, d: Directive, reason: str) -> None:
        self.result.skip(d, reason)

    def unsupported(self, d: Directive) -> None:
        """A directive no family translates: "same as nginx here", or skipped with a reason."""
        if same_as_nginx(d):
            self.result.same_here(d)
        else:
            self.skip(d, unsupported(d))

    def setting(self, d: Directive, scope: Scope) -> bool:
        """True if ``d`` is a setting that locations inherit (kept in ``scope``, or skipped if invalid)."""
        if d.name not in INHERITED:
            return False
        error = check_setting(d)
        if error:
            self.skip(d, error)
        else:
            scope.set(d)
        return True

    def _handler(self, name: str, level: str) -> Callable[[Directive], None] | None:
        r = self.result
        if name in edge.EDGE_DURATIONS:
            return lambda x: edge.edge_duration(r, x)
        handlers: dict[str, Callable[[Directive], None]] = {
            "limit_req_zone": self.limits.limit_req_zone,
            "limit_conn_zone": self.limits.limit_conn_zone,
            "upstream": self.upstreams.upstream,
            "log_format": self.logs.log_format,
            "access_log": lambda x: self.logs.access_log(x, level),
            "error_log": self.logs.error_log,
            "set_real_ip_from": self.access.real_ip_from,
            "real_ip_header": self.access.real_ip_header,
            "real_ip_recursive": self.access.real_ip_recursive,
            "keepalive_timeout": lambda x: edge.keepalive_timeout(r, x),
            "large_client_header_buffers": lambda x: edge.header_buffers(r, x),
            "server_tokens": lambda x: edge.server_tokens(r, x),
        }
        return handlers.get(name)

    def directive(self, d: Directive, level: str, single: bool = True, server: str = "") -> bool:
        """True if ``d`` is a global directive (translated, kept or skipped here); ``single``: the only
        server; ``server``: where the server block is (a server-level directive among several is kept
        until every server is read: see ``shared_settings``)."""
        if d.name in ("allow", "deny"):
            return False  # collected per level by Access.rules
        handler = self._handler(d.name, level)
        if handler is None:
            return False
        if level != "http" and d.name in HTTP_ONLY:
            self.skip(d, f'nginx: "{d.name}" is not allowed here ({level} level)')
            return True
        if level == "server" and not single:
            self.per_server.setdefault(server, []).append(d)
            return True
        if level == "location":
            self.skip(d, f"a per-route {d.name}: the gateway has one value for all routes")
            return True
        handler(d)
        return True

    def shared_settings(self) -> None:
        """Server-level global directives of several servers: one value when every server says the
        same (a shared include), else each is skipped."""
        servers = [s.where for s in self.result.servers]
        said = {where: [(d.name, tuple(d.args)) for d in ds] for where, ds in self.per_server.items()}
        names = sorted({d.name for ds in self.per_server.values() for d in ds})
        for name in names:
            per = {where: [x for x in said.get(where, []) if x[0] == name] for where in servers}
            firsts = next((ds for ds in self.per_server.values() if any(d.name == name for d in ds)), [])
            alike = bool(servers) and len({tuple(v) for v in per.values()}) == 1
            for ds in self.per_server.values():
                for d in ds:
                    if d.name != name:
                        continue
                    if not alike:
                        self.skip(d, f"a per-server {name} that not every server shares: the gateway has one for all")
                    elif d in firsts:
                        handler = self._handler(name, "server")
                        assert handler is not None
                        handler(d)
            if alike and len(servers) > 1:
                self.result.note(f"{name}: every server says the same: one value for all")

    def finish(self) -> Result:
        """The top-level keys the families collected, added to the document."""
        doc = self.result.doc
        self.shared_settings()
        if self.access.real_ip:
            doc["real_ip"] = self.access.real_ip
        if self.logs.log:
            doc["log"] = self.logs.log
        if self.upstreams.upstreams:
            doc["upstreams"] = self.upstreams.upstreams
        if self.limits.zones:
            doc["zones"] = self.limits.zones
        if self.access.http is not None:
            doc["access"] = self.access.http
        return self.result
