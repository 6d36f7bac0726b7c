"""What a route answers with or adds: ``return``, ``proxy_set_header`` and ``add_header``.

Their values may hold variables; one the gateway cannot render (a variable it does
not know) skips the directive, so the output always passes ``gateway check``.
"""

from __future__ import annotations

from gateway.http.templates import parse_value
from gateway.nginxconf.parser import Directive
from gateway.nginxconf.result import Doc, Result, Route, Server
from gateway.nginxconf.scope import Scope
from gateway.nginxconf.values import add_header_entry, return_value, same_as_nginx


def usable_value(result: Result, d: Directive, values: list[str], body: bool = False) -> bool:
    """A value the gateway can render (its variables known to it); else the directive is skipped."""
    for value in values:
        try:
            parse_value(value, body=body, defined=result.defined)
        except ValueError as exc:
            result.skip(d, f"{d.name}: {exc}")
            return False
    return True


def return_target(result: Result, ret: Directive, server: Server | None = None) -> Doc | None:
    """The route's ``return`` key, or None (skipped).

    ``$server_name`` is the server's first name, written out when it is a plain name."""
    value = return_value(ret)
    if value is None:
        result.skip(ret, "return: expected a code 200..599 (and text) or a URL")
        return None
    first = server.names[0] if server is not None and server.names else ""
    if first and not first.startswith(("~", "*", ".")) and not first.endswith("*"):
        for key in ("url", "text"):
            if key in value and "$server_name" in value[key]:
                value[key] = value[key].replace("${server_name}", first).replace("$server_name", first)
    if not usable_value(result, ret, [str(v) for k, v in value.items() if k != "code"], body="text" in value):
        return None
    return value


def route_headers(result: Result, route: Route, scope: Scope) -> None:
    """The ``proxy_set_header`` and ``add_header`` lists the route inherits."""
    headers = []
    for h in scope.array("proxy_set_header"):
        if same_as_nginx(h):
            result.same_here(h)  # the WebSocket handshake and keep-alive: the gateway does it itself
        elif usable_value(result, h, h.args[1:2]):
            headers.append(h)
    if headers:
        route.data["proxy_set_header"] = {h.args[0]: h.args[1] for h in headers}
    added = [h for h in scope.array("add_header") if usable_value(result, h, h.args[1:2])]
    if added:
        route.data["add_header"] = [add_header_entry(h) for h in added]
