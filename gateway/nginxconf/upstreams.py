"""``upstream`` blocks and ``proxy_pass``: the ``upstreams:`` and each route's ``upstream`` and ``uri``.

A ``proxy_pass`` to a host that no ``upstream`` block names makes an upstream of its own
(``host_port``); ``proxy_pass http://unix:/path:/uri`` one whose server is that socket
(``unix__path``), as nginx's implicit upstream: one per scheme and address, so ``https://`` to
an address does not turn its ``http://`` routes to TLS, and two addresses whose names sanitise
alike get ``_2``, ``_3``... rather than one upstream. Servers may be ``unix:/path`` sockets, and
``least_conn``, ``ip_hash`` and ``hash`` are translated as ``balance:``. A ``proxy_pass`` to an
upstream block that was not translated is skipped: no upstream is ever invented for it.
The ``proxy_*_timeout`` and ``proxy_next_upstream_tries`` of the routes
that use an upstream become that upstream's settings (the gateway sets them per upstream).
"""

from __future__ import annotations

import copy
import re
from typing import Any

from gateway.config.reader import host_port
from gateway.config.upstreams import parse_balance, unix_path
from gateway.nginxconf.parser import Directive
from gateway.nginxconf.result import Doc, Result, Route
from gateway.nginxconf.scope import Scope
from gateway.nginxconf.values import UPSTREAM_TIMEOUTS, duration_ok, unsupported


def address_problem(address: str) -> str:
    """Why the gateway would refuse ``address`` as an upstream server ("" if it would not)."""
    try:
        if address[:5].lower() == "unix:":
            unix_path(address)
        else:
            host_port(default_port=80)(address)
    except ValueError as exc:
        return str(exc)
    return ""


class Upstreams:
    def __init__(self, result: Result) -> None:
        self.result = result
        self.upstreams: dict[str, Doc] = {}
        self.where: dict[tuple[str, str], str] = {}  # (upstream, key) -> where the value was first set
        self.dropped: dict[str, str] = {}  # upstream blocks not translated: name -> where
        self.implicit: dict[tuple[str, str], str] = {}  # (scheme, address) of a proxy_pass -> its upstream
        self.named: dict[tuple[str, str], str] = {}  # (scheme, upstream block) of a proxy_pass -> its upstream

    def upstream(self, d: Directive) -> None:
        if d.block is None or len(d.args) != 1:
            self.result.skip(d, "upstream needs a name and a block")
            return
        servers: list[Any] = []
        body: Doc = {}
        for x in d.block:
            if x.name == "server" and x.args:
                server = self._server(x)
                if server is not None:
                    servers.append(server)
            elif x.name == "keepalive" and len(x.args) == 1 and x.args[0].isdigit():
                body["keepalive"] = int(x.args[0])
            elif x.name == "keepalive_timeout" and len(x.args) == 1 and duration_ok(x.args[0]):
                body["keepalive_timeout"] = x.args[0]
            elif x.name in ("least_conn", "ip_hash", "hash") and _balance_ok(x):
                body["balance"] = " ".join([x.name, *x.args])
            else:
                self.result.skip(
                    x,
                    "upstream: the gateway balances by round-robin, least_conn, ip_hash or hash $key [consistent] only"
                    if not x.args or x.name in ("least_conn", "ip_hash", "hash", "random")
                    else unsupported(x),
                )
        usable = [s for s in servers if not (isinstance(s, dict) and (s.get("backup") or s.get("down")))]
        if not usable:
            self.dropped[d.args[0]] = d.where
            self.result.skip(
                d,
                "upstream without a usable server (see its server lines)"
                if not servers
                else "every server is marked backup or down: nothing to send requests to",
            )
            return
        self.upstreams[d.args[0]] = {"servers": servers, **body}

    def _server(self, d: Directive) -> Any:
        address = d.args[0]
        unix = address[:5].lower() == "unix:"
        full = address if unix or re.search(r":\d+$", address) else f"{address}:80"
        problem = address_problem(full)
        if problem:
            self.result.skip(d, f"server {address}: {problem}")
            return None
        entry: Doc = {"address": full}
        for p in d.args[1:]:
            key, _, value = p.partition("=")
            if key in ("weight", "max_fails") and value.isdigit():
                entry[key] = int(value)
            elif key == "fail_timeout" and duration_ok(value):
                entry[key] = value
            elif key in ("backup", "down") and not value:
                entry[key] = True
            else:
                self.result.skip(d, f"server parameter {p} is not supported (max_conns, resolve, service are not)")
                return None
        return entry if len(entry) > 1 else entry["address"]

    def proxy_pass(self, d: Directive, route: Route, regex: bool) -> str | None:
        """Sets the route's upstream; returns the URI part (``uri``), if any."""
        if len(d.args) == 1 and re.match(r"(?i)https?://unix:", d.args[0]) and "$" not in d.args[0]:
            return self._proxy_pass_unix(d, route, regex)
        match = re.fullmatch(r"(https?)://([^/]+)(/.*)?", d.args[0]) if len(d.args) == 1 else None
        if match is None or "$" in d.args[0]:
            self.result.skip(
                d, "proxy_pass: only http(s)://upstream[/uri] or http(s)://host:port[/uri], without variables"
            )
            return None
        scheme, host, uri = match.group(1), match.group(2), match.group(3)
        if uri is not None and regex:
            self.result.skip(d, 'nginx: "proxy_pass" cannot have URI part in location given by regular expression')
            return None
        if host in self.dropped:
            self.result.skip(
                d, f'upstream "{host}" was not translated (see {self.dropped[host]}): no address to send to'
            )
            return None
        if host in self.upstreams and host not in self.implicit.values():  # an upstream block
            name = self._named(scheme, host)
        else:
            port = "443" if scheme == "https" else "80"
            address = host if re.search(r":\d+$", host) else f"{host}:{port}"
            problem = address_problem(address)
            if problem:
                self.result.skip(d, f"proxy_pass to {host}: {problem}")
                return None
            name = self._implicit(scheme, address)
        route.data["upstream"] = name
        return uri

    def _proxy_pass_unix(self, d: Directive, route: Route, regex: bool) -> str | None:
        """``proxy_pass http://unix:/path[:/uri]``: nginx's implicit upstream of one socket (the
        path ends at the first ``:``, what follows is the URI part)."""
        scheme, _, rest = d.args[0].partition("://")
        path, _, uri = rest[5:].partition(":")
        address = f"unix:{path}"
        problem = address_problem(address)
        if problem or (uri and not uri.startswith("/")):
            self.result.skip(d, f"proxy_pass to {address}: {problem or 'the URI part must start with /'}")
            return None
        if uri and regex:
            self.result.skip(d, 'nginx: "proxy_pass" cannot have URI part in location given by regular expression')
            return None
        route.data["upstream"] = self._implicit(scheme.lower(), address)
        return uri or None

    def _free(self, base: str) -> str:
        """``base``, or ``base_2``, ``base_3``...: the first that no upstream has yet."""
        name, n = base, 1
        while name in self.upstreams:
            n += 1
            name = f"{base}_{n}"
        return name

    def _named(self, scheme: str, block: str) -> str:
        """The upstream of ``proxy_pass scheme://block``: the block's own for the first scheme used
        with it, a copy (``block_https``) for the other, as nginx speaks TLS per ``proxy_pass``."""
        name = self.named.get((scheme, block))
        if name is None:
            if not any(b == block for _, b in self.named):
                name = block
            else:
                name = self._free(f"{block}_{scheme}")
                self.upstreams[name] = copy.deepcopy({k: v for k, v in self.upstreams[block].items() if k != "scheme"})
            if scheme == "https":
                self.upstreams[name]["scheme"] = "https"
            self.named[(scheme, block)] = name
        return name

    def _implicit(self, scheme: str, address: str) -> str:
        """The name of nginx's implicit upstream of ``scheme://address``: one per (scheme, address),
        named after the address, with ``_2``, ``_3``... when another upstream has that name (an
        upstream block, or a path that sanitises alike: ``/run/a/b.sock``, ``/run/a_b.sock``)."""
        name = self.implicit.get((scheme, address))
        if name is not None:
            return name
        name = self._free(re.sub(r"[^A-Za-z0-9_.-]", "_", address))
        self.upstreams[name] = {"servers": [address], **({"scheme": "https"} if scheme == "https" else {})}
        self.implicit[(scheme, address)] = name
        return name

    def for_route(self, name: str, scope: Scope) -> None:
        """The timeouts and tries a route sets, as settings of the upstream it uses."""
        upstream = self.upstreams[name]
        pairs = [(nginx, key) for nginx, key in UPSTREAM_TIMEOUTS.items()]
        pairs.append(("proxy_next_upstream_tries", "next_upstream_tries"))
        for nginx_name, key in pairs:
            found = scope.get(nginx_name)
            if found is None:
                continue
            value: Any = int(found.args[0]) if key == "next_upstream_tries" else found.args[0]
            if key in upstream and upstream[key] != value:
                first = self.where.get((name, key), "?")
                self.result.skip(
                    found,
                    f'upstream "{name}" already has {key} {upstream[key]} ({first}): the gateway sets it per upstream',
                )
                continue
            upstream[key] = value
            self.where.setdefault((name, key), found.where)


def _balance_ok(d: Directive) -> bool:
    """``least_conn;``, ``ip_hash;``, or ``hash KEY [consistent];`` with a key the gateway can compute."""
    if d.name in ("least_conn", "ip_hash"):
        return not d.args
    if not 1 <= len(d.args) <= 2 or (len(d.args) == 2 and d.args[1] != "consistent"):
        return False
    try:
        parse_balance(" ".join(["hash", *d.args]))
    except ValueError:
        return False
    return True
