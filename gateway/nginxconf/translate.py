"""nginx directives (a parsed tree) to a gateway configuration (plain data + what was skipped).

Every directive ends up in exactly one place: translated into ``Result.doc`` (or a
server's routes), or listed in ``Result.skipped`` with its file:line and the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gateway.config.servers import parse_server_name
from gateway.http.templates import parse_value
from gateway.logs.formats import PRESETS, unknown_variables
from gateway.nginxconf.parser import Directive
from gateway.nginxconf.scope import Scope
from gateway.nginxconf.values import (
    EDGE_DURATIONS,
    INHERITED,
    LIMIT_LOG_LEVEL,
    LIMIT_STATUS,
    LOG_LEVELS,
    ROUTE_DURATIONS,
    ROUTE_ON_OFF,
    ROUTE_SIZES,
    UPSTREAM_TIMEOUTS,
    add_header_entry,
    check_setting,
    duration_ok,
    key_values,
    limit_req_entry,
    location_text,
    log_target,
    rate_problem,
    return_value,
    unsupported,
    zone_problem,
)

Doc = dict[str, Any]
SSL_DIRECTIVES = ("ssl_certificate", "ssl_certificate_key", "ssl_protocols", "ssl_ciphers", "ssl_session_tickets")


@dataclass(frozen=True, slots=True)
class Skipped:
    where: str
    text: str
    reason: str

    def line(self) -> str:
        return f"{self.where}: {self.text} -- {self.reason}"


@dataclass(slots=True)
class Route:
    data: Doc
    ident: tuple[str, str] = ("", "")


@dataclass(slots=True)
class Server:
    where: str
    names: list[str] = field(default_factory=list)
    listen: list[str] = field(default_factory=list)
    default: bool = False
    routes: list[Route] = field(default_factory=list)
    tls: Doc = field(default_factory=dict)  # the server's own ssl_* keys


@dataclass(slots=True)
class Result:
    doc: Doc = field(default_factory=dict)
    servers: list[Server] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class _Translator:
    def __init__(self) -> None:
        self.r = Result()
        self.zones: dict[str, Doc] = {}
        self.zone_kind: dict[str, str] = {}
        self.bad_zones: set[str] = set()
        self.upstreams: dict[str, Doc] = {}
        self.upstream_where: dict[tuple[str, str], str] = {}
        self.formats: dict[str, tuple[str, Directive]] = {}
        self.log: Doc = {}
        self.real_ip: Doc = {}
        self.access_deny: list[str] = []
        self.access_from: Directive | None = None  # the http-level access_log, which a server's overrides

    def skip(self, d: Directive, reason: str) -> None:
        self.r.skipped.append(Skipped(d.where, d.text(), reason))

    # -- levels -----------------------------------------------------------------------------

    def main(self, directives: list[Directive]) -> Result:
        http_like = {"server", "upstream", "limit_req_zone", "limit_conn_zone", "location"}
        if not any(d.name == "http" for d in directives) and any(d.name in http_like for d in directives):
            self.http(directives, Scope())  # a fragment such as conf.d/site.conf
        else:
            for d in directives:
                if d.name == "http" and d.block is not None:
                    self.http(d.block, Scope())
                elif d.name == "events" and d.block is not None:
                    self.events(d.block)
                elif d.name == "worker_processes" and d.args:
                    self.worker_processes(d)
                elif d.name == "error_log":
                    self.error_log(d)
                else:
                    self.skip(d, "a main-context directive the gateway has no use for")
        self.finish()
        return self.r

    def events(self, block: list[Directive]) -> None:
        for d in block:
            if d.name == "worker_connections" and len(d.args) == 1 and d.args[0].isdigit():
                self.r.doc["worker_connections"] = int(d.args[0])
            else:
                self.skip(d, "events: only worker_connections has a gateway equivalent")

    def worker_processes(self, d: Directive) -> None:
        value = d.args[0]
        if value == "auto":
            self.r.doc["workers"] = "auto"
        elif value.isdigit() and 1 <= int(value) <= 512:
            self.r.doc["workers"] = int(value)
        else:
            self.skip(d, "workers must be auto or 1..512")

    def http(self, block: list[Directive], scope: Scope) -> None:
        servers = [d for d in block if d.name == "server" and d.block is not None]
        for d in block:
            if d.name in ("server", "location") or self.setting(d, scope, level="http"):
                continue
            if d.name in SSL_DIRECTIVES:
                self.ssl(d, self.r.doc)
            elif not self.global_directive(d, scope, level="http"):
                self.skip(d, unsupported(d))
        for d in block:
            if d.name == "location":
                self.skip(d, 'nginx: "location" is not allowed here (http level)')
        for d in servers:
            assert d.block is not None
            self.server(d, d.block, scope.child(), single=len(servers) == 1)

    def global_directive(self, d: Directive, scope: Scope, level: str, single: bool = True) -> bool:
        handlers = {
            "limit_req_zone": self.limit_req_zone,
            "limit_conn_zone": self.limit_conn_zone,
            "upstream": self.upstream,
            "log_format": self.log_format,
            "access_log": self.access_log,
            "error_log": self.error_log,
            "set_real_ip_from": self.real_ip_from,
            "real_ip_header": self.real_ip_header,
            "real_ip_recursive": self.real_ip_recursive,
            "keepalive_timeout": self.keepalive_timeout,
            "large_client_header_buffers": self.header_buffers,
            "server_tokens": self.server_tokens,
        }
        if d.name in ("allow", "deny"):
            return False  # collected per level by access_rules
        handler = self.edge_duration if d.name in EDGE_DURATIONS else handlers.get(d.name)
        if handler is None:
            return False
        if level != "http" and d.name in ("limit_req_zone", "limit_conn_zone", "upstream", "log_format"):
            self.skip(d, f'nginx: "{d.name}" is not allowed here ({level} level)')
            return True
        if level == "location" or (level == "server" and not single):
            where = "route" if level == "location" else "server"
            self.skip(d, f"a per-{where} {d.name}: the gateway has one value for all {where}s")
            return True
        if d.name == "access_log" and level == "server" and self.access_from is not None:
            self.skip(self.access_from, f"overridden by the server's access_log ({d.where}), as in nginx")
            self.log.pop("access", None)
            self.log.pop("format", None)
        handler(d)
        if d.name == "access_log" and level == "http":
            self.access_from = d
        return True

    def server(self, d: Directive, block: list[Directive], scope: Scope, single: bool) -> None:
        server = Server(where=d.where)
        rules = [x for x in block if x.name in ("allow", "deny")]
        if rules:
            self.access_rules(rules, scope, global_ok=single)
        for x in block:
            if x.name in ("allow", "deny", "location") or self.setting(x, scope, level="server"):
                continue
            if x.name == "listen":
                self.listen(x, server)
            elif x.name == "server_name":
                server.names.extend(self.server_names(x))
            elif x.name in SSL_DIRECTIVES:
                self.ssl(x, server.tls)
            elif x.name == "return":
                self.skip(x, "a server-level return: write it as a location / with return")
            elif not self.global_directive(x, scope, level="server", single=single):
                self.skip(x, unsupported(x))
        if not any(x.name == "listen" for x in block):
            server.listen.append("0.0.0.0:80")  # nginx's default (as root)
        elif not server.listen:
            self.skip(d, "no listen address the gateway can serve (see the listen lines): server left out")
            return
        seen: dict[tuple[str, str], str] = {}
        for x in block:
            if x.name == "location":
                self.location(x, scope.child(), server, None, seen)
        self.r.servers.append(server)

    def listen(self, d: Directive, server: Server) -> None:
        if not d.args:
            self.skip(d, "listen needs an address")
            return
        address, params = d.args[0], d.args[1:]
        known = ("default_server", "default", "reuseport", "backlog", "ssl")
        bad = [p for p in params if p.split("=")[0] not in known]
        if address.startswith("unix:"):
            self.skip(d, "the gateway listens on TCP only (no unix: sockets)")
            return
        if bad:
            self.skip(d, f"listen parameters {' '.join(bad)} are not supported (no HTTP2/QUIC/PROXY protocol)")
            return
        if address.isdigit():
            address = f"0.0.0.0:{address}"
        elif address.startswith("*:"):
            address = "0.0.0.0:" + address[2:]
        elif ":" not in address.replace("[::]", "").rsplit("]", 1)[-1]:
            address = f"{address}:80"
        server.listen.append(f"{address} ssl" if "ssl" in params else address)
        if "default_server" in params or "default" in params:
            server.default = True
        extra = [p for p in params if p.split("=")[0] in ("reuseport", "backlog")]
        if extra:
            self.r.notes.append(
                f"{d.where}: listen {' '.join(extra)}: not needed (the gateway sets SO_REUSEPORT itself)"
            )

    def ssl(self, d: Directive, into: Doc) -> None:
        """``ssl_certificate``, ``ssl_certificate_key``, ``ssl_protocols``, ``ssl_ciphers``,
        ``ssl_session_tickets``: the gateway's keys of the same names, at the same level."""
        key = d.name
        if not d.args:
            self.skip(d, f"{key} needs a value")
        elif key in ("ssl_certificate", "ssl_certificate_key") and key in into:
            self.skip(d, f"a second {key} (nginx's RSA + ECDSA pair): the gateway serves one per name")
        elif key in ("ssl_certificate", "ssl_certificate_key") and "$" in d.args[0]:
            self.skip(d, f"{key} with variables: list the certificates in ssl_certificates instead")
        elif key == "ssl_protocols":
            if any(p in ("SSLv2", "SSLv3") for p in d.args):
                self.r.notes.append(f"{d.where}: ssl_protocols: SSLv2/SSLv3 dropped (Python's ssl has neither)")
            into[key] = " ".join(p for p in d.args if p not in ("SSLv2", "SSLv3")) or "TLSv1.2 TLSv1.3"
        elif key == "ssl_session_tickets":
            into[key] = d.args[0] == "on"
        else:
            into[key] = d.args[0]

    # -- settings inherited by locations --------------------------------------------------------

    def setting(self, d: Directive, scope: Scope, level: str) -> bool:
        if d.name not in INHERITED:
            return False
        error = check_setting(d)
        if error:
            self.skip(d, error)
        else:
            scope.set(d)
        return True

    # -- locations ----------------------------------------------------------------------------

    def location(
        self,
        d: Directive,
        scope: Scope,
        server: Server,
        parent: tuple[str, str] | None,
        seen: dict[tuple[str, str], str],
    ) -> None:
        assert d.block is not None
        spec = location_text(d.args)
        if spec is None:
            self.skip(d, "named (@) locations and locations without a path are not supported")
            return
        modifier, path = spec
        ident = ("regex" if modifier in ("~", "~*") else "prefix" if modifier in ("", "^~") else modifier, path)
        if parent is not None and parent[0] == "prefix" and ident[0] != "regex" and not path.startswith(parent[1]):
            self.skip(d, f'nginx: location "{path}" is outside location "{parent[1]}"')
            return
        if parent is not None and ident[0] == "regex" and parent[0] == "prefix":
            self.r.notes.append(
                f"{d.where}: nested regex location {modifier} {path}: nginx tries it only for URIs under "
                f"{parent[1]}; the flattened route is tried for every URI"
            )
        rules = [x for x in d.block if x.name in ("allow", "deny")]
        for x in rules:
            self.skip(x, "per-location allow/deny: the gateway's access rules are global (access.allow/deny)")
        proxy: Directive | None = None
        ret: Directive | None = None
        for x in d.block:
            if x.name in ("allow", "deny", "location") or self.setting(x, scope, level="location"):
                continue
            if x.name == "proxy_pass":
                proxy = x
            elif x.name == "return":
                ret = x
            elif x.name in ("if", "limit_except"):
                self.skip(x, f'"{x.name}" blocks are not supported: the directives inside were not applied')
            elif not self.global_directive(x, scope, level="location"):
                self.skip(x, unsupported(x))
        text = f"{modifier} {path}" if modifier else path
        if ident in seen:
            self.skip(d, f'duplicate location "{text}" (first at {seen[ident]})')
        else:
            seen[ident] = d.where
            route = self.route(d, text, ident, scope, proxy, ret)
            if route is not None:
                server.routes.append(route)
        for x in d.block:
            if x.name == "location":
                self.location(x, scope.child(), server, ident, seen)

    def route(
        self,
        d: Directive,
        text: str,
        ident: tuple[str, str],
        scope: Scope,
        proxy: Directive | None,
        ret: Directive | None,
    ) -> Route | None:
        route = Route(data={"location": text}, ident=ident)
        target: Doc = {}  # "return" or "uri", written after the settings
        if ret is not None:
            value = return_value(ret)
            if value is None:
                self.skip(ret, "return: expected a code 200..599 (and text) or a URL")
            elif self.usable_value(ret, [str(v) for k, v in value.items() if k != "code"], body="text" in value):
                target["return"] = value
            if proxy is not None:
                self.skip(proxy, "proxy_pass after return is never reached in nginx")
        elif proxy is not None:
            uri = self.proxy_pass(proxy, route, regex=ident[0] == "regex")
            if uri is not None:
                target["uri"] = uri
        if "upstream" not in route.data and not target:
            self.skip(d, "no proxy_pass here: nginx serves it itself (root, static files); the gateway only proxies")
            return None
        self.route_settings(route, scope)
        route.data.update(target)
        self.route_headers(route, scope)
        return route

    def usable_value(self, d: Directive, values: list[str], body: bool = False) -> bool:
        """A value the gateway can render (its variables known to it); else the directive is skipped."""
        for value in values:
            try:
                parse_value(value, body=body)
            except ValueError as exc:
                self.skip(d, f"{d.name}: {exc}")
                return False
        return True

    def server_names(self, d: Directive) -> list[str]:
        names = []
        for name in d.args:
            if name in ("", "_"):
                continue  # nginx's catch-all spellings: names nothing, the default server catches all
            try:
                parse_server_name(name)
            except ValueError as exc:
                self.skip(d, f"server_name: {exc}")
                continue
            names.append(name)
        return names

    def proxy_pass(self, d: Directive, route: Route, regex: bool) -> str | None:
        """Sets the route's upstream; returns the URI part (``uri``), if any."""
        match = re.fullmatch(r"(https?)://([^/]+)(/.*)?", d.args[0]) if len(d.args) == 1 else None
        if match is None or "$" in d.args[0]:
            self.skip(d, "proxy_pass: only http(s)://upstream[/uri] or http(s)://host:port[/uri], without variables")
            return None
        scheme, host, uri = match.group(1), match.group(2), match.group(3)
        if uri is not None and regex:
            self.skip(d, 'nginx: "proxy_pass" cannot have URI part in location given by regular expression')
            return None
        if host in self.upstreams:
            name = host
        else:
            port = "443" if scheme == "https" else "80"
            address = host if re.search(r":\d+$", host) else f"{host}:{port}"
            name = re.sub(r"[^A-Za-z0-9_.-]", "_", address)
            if name not in self.upstreams:
                self.upstreams[name] = {"servers": [address]}
        if scheme == "https":
            self.upstreams[name]["scheme"] = "https"
        route.data["upstream"] = name
        return uri

    def route_settings(self, route: Route, scope: Scope) -> None:
        data = route.data
        for name, key in (*ROUTE_DURATIONS.items(), *ROUTE_SIZES.items()):
            found = scope.get(name)
            if found is not None:
                data[key] = found.args[0]
        for name, key in ROUTE_ON_OFF.items():
            found = scope.get(name)
            if found is not None:
                data[key] = found.args[0] == "on"
        buffers = scope.get("proxy_buffers")
        if buffers is not None:
            data["proxy_buffers"] = " ".join(buffers.args)
        self.route_limits(route, scope)
        for name in (*LIMIT_STATUS, *LIMIT_LOG_LEVEL):
            found = scope.get(name)
            if found is not None:
                data[name] = int(found.args[0]) if name in LIMIT_STATUS else found.args[0]
        self.dry_run(route, scope)
        if "upstream" in data:
            self.upstream_settings(data["upstream"], scope)

    def route_headers(self, route: Route, scope: Scope) -> None:
        headers = [h for h in scope.array("proxy_set_header") if self.usable_value(h, h.args[1:2])]
        if headers:
            route.data["proxy_set_header"] = {h.args[0]: h.args[1] for h in headers}
        added = [h for h in scope.array("add_header") if self.usable_value(h, h.args[1:2])]
        if added:
            route.data["add_header"] = [add_header_entry(h) for h in added]

    def route_limits(self, route: Route, scope: Scope) -> None:
        reqs: list[Doc] = []
        for d in scope.array("limit_req"):
            entry = limit_req_entry(d)
            zone = entry["zone"]
            if zone in self.bad_zones:
                self.skip(d, f'zone "{zone}" was not translated (see its limit_req_zone)')
            elif self.zone_kind.get(zone) != "req":
                self.skip(d, f'nginx: zero size shared memory zone "{zone}" (no limit_req_zone defines it)')
            elif zone in (e["zone"] for e in reqs):
                self.skip(d, f'nginx: the "limit_req" directive with zone "{zone}" is duplicate')
            else:
                reqs.append(entry)
        conns: list[Doc] = []
        for d in scope.array("limit_conn"):
            zone = d.args[0]
            if zone in self.bad_zones:
                self.skip(d, f'zone "{zone}" was not translated (see its limit_conn_zone)')
            elif self.zone_kind.get(zone) != "conn":
                self.skip(d, f'nginx: no limit_conn_zone defines "{zone}"')
            elif zone in (e["zone"] for e in conns):
                self.skip(d, f'nginx: the "limit_conn" directive with zone "{zone}" is duplicate')
            else:
                conns.append({"zone": zone, "max": int(d.args[1])})
        if reqs:
            route.data["limit_req"] = reqs
        if conns:
            route.data["limit_conn"] = conns

    def dry_run(self, route: Route, scope: Scope) -> None:
        req_d, conn_d = scope.get("limit_req_dry_run"), scope.get("limit_conn_dry_run")
        req_on = req_d is not None and req_d.args[0] == "on"
        conn_on = conn_d is not None and conn_d.args[0] == "on"
        has_req, has_conn = "limit_req" in route.data, "limit_conn" in route.data
        if has_req and has_conn and req_on != conn_on:
            source = req_d if req_on else conn_d
            assert source is not None
            self.skip(
                source,
                f"route {route.data['location']}: the gateway has one dry_run for limit_req and limit_conn together",
            )
            return
        if (has_req and req_on) or (has_conn and conn_on):
            route.data["dry_run"] = True

    def upstream_settings(self, name: str, scope: Scope) -> None:
        upstream = self.upstreams[name]
        pairs = [(nginx, key) for nginx, key in UPSTREAM_TIMEOUTS.items()]
        pairs.append(("proxy_next_upstream_tries", "next_upstream_tries"))
        for nginx_name, key in pairs:
            found = scope.get(nginx_name)
            if found is None:
                continue
            value: Any = int(found.args[0]) if key == "next_upstream_tries" else found.args[0]
            if key in upstream and upstream[key] != value:
                first = self.upstream_where.get((name, key), "?")
                self.skip(
                    found,
                    f'upstream "{name}" already has {key} {upstream[key]} ({first}): the gateway sets it per upstream',
                )
                continue
            upstream[key] = value
            self.upstream_where.setdefault((name, key), found.where)

    # -- http-level definitions -----------------------------------------------------------------

    def limit_req_zone(self, d: Directive) -> None:
        params = key_values(d.args[1:])
        zone = params.get("zone", "")
        name, _, zone_size = zone.partition(":")
        problem = zone_problem(d, name, zone_size) or rate_problem(params.get("rate"))
        unknown = set(params) - {"zone", "rate"}
        if not problem and unknown:
            problem = f"parameters {', '.join(sorted(unknown))} are not supported (sync is NGINX Plus)"
        if problem:
            self.bad_zones.add(name)
            self.skip(d, problem)
            return
        self.zones[name] = {"type": "req", "key": d.args[0], "rate": params["rate"], "size": zone_size}
        self.zone_kind[name] = "req"

    def limit_conn_zone(self, d: Directive) -> None:
        params = key_values(d.args[1:])
        name, _, zone_size = params.get("zone", "").partition(":")
        problem = zone_problem(d, name, zone_size)
        if problem:
            self.bad_zones.add(name)
            self.skip(d, problem)
            return
        self.zones[name] = {"type": "conn", "key": d.args[0], "size": zone_size}
        self.zone_kind[name] = "conn"

    def upstream(self, d: Directive) -> None:
        if d.block is None or len(d.args) != 1:
            self.skip(d, "upstream needs a name and a block")
            return
        servers: list[Any] = []
        body: Doc = {}
        for x in d.block:
            if x.name == "server" and x.args:
                server = self.upstream_server(x)
                if server is not None:
                    servers.append(server)
            elif x.name == "keepalive" and len(x.args) == 1 and x.args[0].isdigit():
                body["keepalive"] = int(x.args[0])
            elif x.name == "keepalive_timeout" and len(x.args) == 1 and duration_ok(x.args[0]):
                body["keepalive_timeout"] = x.args[0]
            else:
                self.skip(
                    x,
                    "upstream: the gateway balances by smooth weighted round-robin only"
                    if not x.args or x.name in ("least_conn", "ip_hash", "hash", "random")
                    else unsupported(x),
                )
        if not servers:
            self.skip(d, "upstream without a usable server")
            return
        self.upstreams[d.args[0]] = {"servers": servers, **body}

    def upstream_server(self, d: Directive) -> Any:
        address = d.args[0]
        if address.startswith("unix:"):
            self.skip(d, "unix: sockets are not supported as upstream servers")
            return None
        entry: Doc = {"address": address if re.search(r":\d+$", address) else f"{address}:80"}
        for p in d.args[1:]:
            key, _, value = p.partition("=")
            if key in ("weight", "max_fails") and value.isdigit():
                entry[key] = int(value)
            elif key == "fail_timeout" and duration_ok(value):
                entry[key] = value
            elif key in ("backup", "down") and not value:
                entry[key] = True
            else:
                self.skip(d, f"server parameter {p} is not supported (max_conns, resolve, service are not)")
                return None
        return entry if len(entry) > 1 else entry["address"]

    def log_format(self, d: Directive) -> None:
        if len(d.args) < 2:
            self.skip(d, "log_format needs a name and a format")
            return
        parts = d.args[1:]
        if parts[0].startswith("escape="):
            if parts[0] != "escape=default":
                self.skip(d, f"{parts[0]}: the gateway escapes quotes and control bytes as \\xHH (nginx's default)")
            parts = parts[1:]
        self.formats[d.args[0]] = ("".join(parts), d)

    def access_log(self, d: Directive) -> None:
        if "access" in self.log:
            self.skip(d, "the gateway writes one access log: only the first access_log is used")
            return
        if not d.args:
            self.skip(d, "access_log needs a path")
            return
        if d.args[0] == "off":
            self.log["access"] = "off"
            return
        if d.args[0].startswith("syslog:") or len(d.args) > 2:
            self.skip(d, "syslog and buffer=/flush=/gzip/if= are not supported: a file, stdout or stderr only")
            return
        name = d.args[1] if len(d.args) > 1 else "combined"
        if name not in ("combined", "main") and name not in self.formats:
            self.skip(d, f'nginx: unknown log format "{name}"')
            return
        template = self.formats[name][0] if name in self.formats else name
        unknown = unknown_variables(template) if template not in PRESETS else []
        if unknown:
            self.skip(d, f'log_format {name} uses "${unknown[0]}", which the gateway does not log')
            return
        self.log["access"] = log_target(d.args[0])
        self.log["format"] = template

    def error_log(self, d: Directive) -> None:
        if not d.args or d.args[0].startswith(("syslog:", "memory:")) or "error" in self.log:
            self.skip(d, "the gateway writes one error log to a file, stdout or stderr")
            return
        level = d.args[1] if len(d.args) > 1 else "error"
        if level not in LOG_LEVELS:
            self.skip(d, f"error_log level {level}: the gateway has info, notice, warn and error")
            return
        self.log["error"] = log_target(d.args[0])
        self.log["level"] = level

    def real_ip_from(self, d: Directive) -> None:
        if d.args and d.args[0] == "unix:":
            self.skip(d, "unix: peers are not supported")
            return
        self.real_ip.setdefault("from", []).extend(d.args)

    def real_ip_header(self, d: Directive) -> None:
        if d.args and d.args[0] == "proxy_protocol":
            self.skip(d, "the PROXY protocol is not supported")
            return
        self.real_ip["header"] = d.args[0]

    def real_ip_recursive(self, d: Directive) -> None:
        self.real_ip["recursive"] = d.args[0] == "on"

    def access_rules(self, rules: list[Directive], scope: Scope, global_ok: bool) -> None:
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
                self.skip(r, reason)
            return
        for r in denies:
            self.access_deny.append(r.args[0])

    # -- edge ---------------------------------------------------------------------------------

    def edge_duration(self, d: Directive) -> None:
        if len(d.args) == 1 and duration_ok(d.args[0]):
            self.r.doc[d.name] = d.args[0]
        else:
            self.skip(d, "expected one duration")

    def keepalive_timeout(self, d: Directive) -> None:
        if d.args and duration_ok(d.args[0]):
            self.r.doc["keepalive_timeout"] = d.args[0]
            if len(d.args) > 1:
                self.r.notes.append(f"{d.where}: keepalive_timeout's header timeout ({d.args[1]}) is not sent")
        else:
            self.skip(d, "expected a duration")

    def header_buffers(self, d: Directive) -> None:
        self.r.doc["large_client_header_buffers"] = " ".join(d.args)

    def server_tokens(self, d: Directive) -> None:
        if d.args and d.args[0] in ("on", "off"):
            self.r.doc["server_tokens"] = d.args[0] == "on"
        else:
            self.skip(d, "server_tokens: on or off (build and strings are NGINX Plus)")

    # -- the document -------------------------------------------------------------------------

    def finish(self) -> None:
        doc = self.r.doc
        if self.real_ip:
            doc["real_ip"] = self.real_ip
        if self.log:
            doc["log"] = self.log
        if self.upstreams:
            doc["upstreams"] = self.upstreams
        if self.zones:
            doc["zones"] = self.zones
        if self.access_deny:
            doc["access"] = {"deny": self.access_deny}


def translate(directives: list[Directive]) -> Result:
    return _Translator().main(directives)
