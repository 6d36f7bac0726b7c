"""A translation ``Result`` written as a commented gateway configuration (YAML).

One server block is written as top-level ``listen`` and ``routes``; several as
``servers:`` (virtual hosts). What was not translated heads the file as comments.
"""

from __future__ import annotations

from typing import Any

import yaml

from gateway.nginxconf.result import Result, Route, Server


def _dump(value: Any) -> str:
    return yaml.safe_dump(value, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1000)


def _one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _route_lines(route: Route) -> list[str]:
    return [f"# {_one_line(c)}" for c in route.comments] + _dump([route.data]).splitlines()


def _main_server(servers: list[Server]) -> Server | None:
    for s in servers:
        if s.default:
            return s
    return servers[0] if servers else None


def _server_doc(server: Server) -> list[str]:
    head: dict[str, Any] = {}
    if server.names:
        head["server_name"] = server.names
    head["listen"] = server.listen
    if server.default:
        head["default_server"] = True
    head.update(server.tls)
    if server.rules:
        head["rules"] = server.rules
    if server.access is not None:
        head["access"] = server.access
    lines = ["- " + _dump(head).replace("\n", "\n  ").rstrip()]
    lines.append("  routes:")
    for route in server.routes:
        lines += ["  " + line for line in _route_lines(route)]
    return lines


def render(result: Result, source: str) -> str:
    out = [f"# Imported from {source} by gateway import-nginx."]
    if result.skipped:
        out.append("# Not translated (file:line: directive -- reason):")
        out += [f"#   {_one_line(s.line())}" for s in result.skipped]
    if result.refused:
        out.append("# Fail closed: routes that refuse every request (--allow-open proxies those refused for a guard):")
        out += [f"#   {_one_line(n)}" for n in result.refused]
    if result.notes:
        out.append("# Translated with a difference:")
        out += [f"#   {_one_line(n)}" for n in result.notes]
    if result.same:
        out.append(f"# Same as nginx here (no key needed): {_one_line(result.same_line())}")
    doc = dict(result.doc)
    servers = result.servers
    if len(servers) > 1:
        out.append(_dump(doc).rstrip() if doc else "")
        out.append("servers:")
        for server in servers:
            out += _server_doc(server)
        return "\n".join(line for line in out if line) + "\n"
    main = _main_server(servers)
    if main is not None:
        doc = {"listen": main.listen if len(main.listen) > 1 else main.listen[0], **doc, **main.tls}
        if main.rules:
            doc["rules"] = main.rules
        if main.access is not None:  # the one server's own list replaces the http level's
            doc["access"] = main.access
    if doc:
        out.append(_dump(doc).rstrip())
    out.append("routes:" if main is not None and main.routes else "routes: []")
    if main is not None:
        for route in main.routes:
            out += _route_lines(route)
    return "\n".join(out) + "\n"
