"""Choosing the virtual server for a request, in nginx's order.

The local address the connection arrived on picks the servers that listen there (a
server listening on a specific address hides the wildcard ones on that address, as in
nginx); then ``$host`` (lower case, without port and without one trailing dot) picks among them:

1. an exact name;
2. the longest leading wildcard (``*.example.org``, ``.example.org``);
3. the longest trailing wildcard (``www.example.*``);
4. the first regular expression that matches, in configuration order;
5. the default server: the one with ``default_server: true`` for that address, else the
   first server listening there.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from gateway.config.servers import ListenSpec, ServerName


S = TypeVar("S")


class NameTable(Generic[S]):
    """The servers of one listen address, by name."""

    def __init__(self, servers: Sequence[tuple[tuple[ServerName, ...], bool, S]]) -> None:
        self.exact: dict[str, S] = {}
        leading: list[tuple[str, S]] = []
        trailing: list[tuple[str, S]] = []
        self.regexes: list[tuple[re.Pattern[str], S]] = []
        default: S | None = None
        for names, is_default, server in servers:
            if is_default and default is None:
                default = server
            for name in names:
                if name.kind == "exact":
                    self.exact.setdefault(name.value, server)
                elif name.kind == "leading":
                    leading.append((name.value, server))
                    if name.also_exact:
                        self.exact.setdefault(name.value[1:], server)
                elif name.kind == "trailing":
                    trailing.append((name.value, server))
                else:
                    assert name.pattern is not None
                    self.regexes.append((name.pattern, server))
        leading.sort(key=lambda item: len(item[0]), reverse=True)
        trailing.sort(key=lambda item: len(item[0]), reverse=True)
        self.leading = tuple(leading)
        self.trailing = tuple(trailing)
        self.default: S = default if default is not None else servers[0][2]

    def find(self, host: str) -> S:
        """The server for ``host``, nginx's ``$host`` (``gateway.http.context.host_of``): lower case,
        without port or trailing dot."""
        server = self.exact.get(host)
        if server is not None:
            return server
        for suffix, candidate in self.leading:
            if host.endswith(suffix) and len(host) > len(suffix):
                return candidate
        for prefix, candidate in self.trailing:
            if host.startswith(prefix) and len(host) > len(prefix):
                return candidate
        for pattern, candidate in self.regexes:
            if pattern.search(host):
                return candidate
        return self.default


def _ip(host: str) -> str:
    """A listen host as the address the socket reports (a name resolved once, at load)."""
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        pass
    try:
        return str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    except OSError:
        return host


class ServerTable(Generic[S]):
    """Every listen address's ``NameTable``."""

    def __init__(self, servers: Sequence[tuple[tuple[ServerName, ...], tuple[ListenSpec, ...], bool, S]]) -> None:
        members: dict[tuple[str, int], list[tuple[tuple[ServerName, ...], bool, S]]] = {}
        for names, listen, is_default, server in servers:
            for entry in listen:
                members.setdefault((_ip(entry.host), entry.port), []).append((names, is_default, server))
        self.by_address = {addr: NameTable(group) for addr, group in members.items()}
        self.first = next(iter(self.by_address.values()))

    def find(self, local: tuple[str, int] | None, host: str) -> S:
        if local is None:
            return self.first.find(host)
        ip = local[0]
        table = self.by_address.get((ip, local[1]))
        if table is None:
            table = self.by_address.get((wildcard_of(ip), local[1]))
            if table is None and ip.startswith("::ffff:"):
                table = self.by_address.get(("0.0.0.0", local[1]))
            if table is None:
                table = self.first
        return table.find(host)


def wildcard_of(host: str) -> str:
    return "::" if ":" in host else "0.0.0.0"
