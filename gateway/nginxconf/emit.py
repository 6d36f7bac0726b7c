"""A translation ``Result`` written as a commented gateway configuration (YAML).

Virtual hosts (``servers:``), ``uri``, ``proxy_set_header``, ``add_header`` and
``return`` are written as keys. ``emit_future=False`` writes them as comments marked
``# needs: <feature>`` instead, the form for a gateway older than these features.
"""

from __future__ import annotations

from typing import Any

import yaml

from gateway.nginxconf.translate import Result, Route, Server


def _dump(value: Any) -> str:
    return yaml.safe_dump(value, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1000)


def _comment(text: str, indent: str = "") -> list[str]:
    return [f"{indent}# {line}" for line in text.rstrip("\n").splitlines()]


def _one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _route_lines(route: Route, emit_future: bool) -> list[str]:
    data = dict(route.data)
    if emit_future:
        for f in route.future:
            data[f.key] = f.value
        return _dump([data]).splitlines()
    if not route.usable_today:
        features = ", ".join(sorted({f.feature for f in route.future}))
        full = dict(data)
        for f in route.future:
            full[f.key] = f.value
        return [f"# needs: {features} (this whole route)", *_comment(_dump([full]))]
    lines = _dump([data]).splitlines()
    for f in route.future:
        lines.append(f"  # needs: {f.feature} ({f.where})")
        lines += _comment(_dump({f.key: f.value}), "  ")
    return lines


def _main_server(servers: list[Server]) -> Server | None:
    for s in servers:
        if s.default:
            return s
    return servers[0] if servers else None


def _server_doc(server: Server, emit_future: bool) -> list[str]:
    head: dict[str, Any] = {}
    if server.names:
        head["server_name"] = server.names
    head["listen"] = server.listen
    if server.default:
        head["default_server"] = True
    head.update(server.tls)
    lines = ["- " + _dump(head).replace("\n", "\n  ").rstrip()]
    lines.append("  routes:")
    for route in server.routes:
        lines += ["  " + line for line in _route_lines(route, emit_future)]
    return lines


def render(result: Result, source: str, emit_future: bool = True) -> str:
    out = [f"# Imported from {source} by gateway import-nginx."]
    if result.skipped:
        out.append("# Not translated (file:line: directive -- reason):")
        out += [f"#   {_one_line(s.line())}" for s in result.skipped]
    if result.notes:
        out.append("# Translated with a difference:")
        out += [f"#   {_one_line(n)}" for n in result.notes]
    doc = dict(result.doc)
    servers = result.servers
    virtual = len(servers) > 1
    if virtual and emit_future:
        out.append(_dump(doc).rstrip() if doc else "")
        out.append("servers:")
        for server in servers:
            out += _server_doc(server, emit_future)
        return "\n".join(line for line in out if line) + "\n"
    main = _main_server(servers)
    if main is not None:
        doc = {"listen": main.listen if len(main.listen) > 1 else main.listen[0], **doc, **main.tls}
    if doc:
        out.append(_dump(doc).rstrip())
    out.append("routes:" if main is not None and main.routes else "routes: []")
    if main is not None:
        for route in main.routes:
            out += _route_lines(route, emit_future)
    others = [s for s in servers if s is not main]
    if others:
        out.append("# needs: servers (virtual hosts): the other server blocks, as the gateway will read them:")
        out.append("# servers:")
        for server in others:
            out += _comment("\n".join(_server_doc(server, True)))
    return "\n".join(out) + "\n"
