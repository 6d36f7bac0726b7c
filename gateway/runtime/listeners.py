"""The client listeners of one serving process, and how a reload changes them.

A ``listen`` entry is treated as an opaque, hashable value compared by equality
(today ``(host, port)``; it may grow more fields such as TLS); ``address_of`` is
the one place that reads its host and port, and ``bind`` the one function that
turns an entry into a listening socket.

A reload that changes ``listen`` runs in two steps, like nginx's: ``prepare``
binds every added entry first (any failure closes what it bound and raises, so
the old set keeps serving untouched), then ``commit`` starts accepting on the new
sockets and stops the removed listeners. Requests in flight on a removed listener
finish; its keep-alive connections close after their current request.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from aiohttp import web

ListenEntry = Hashable
BACKLOG = 511


def address_of(entry: Any) -> tuple[str, int]:
    """The host and port of a ``listen`` entry (a ``ListenSpec``, or a ``(host, port)`` pair)."""
    if isinstance(entry, tuple):
        return str(entry[0]), int(entry[1])
    return str(entry.host), int(entry.port)


def describe(entry: Any) -> str:
    host, port = address_of(entry)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind(entry: Any, reuse_port: bool, *, listen: bool = True) -> socket.socket:
    """A non-blocking socket bound to ``entry`` (listening unless ``listen`` is False); raises OSError."""
    host, port = address_of(entry)
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(addr)
        if listen:
            sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class BindFailed(Exception):
    """A listen entry could not be bound; the message names the address and the reason."""


def bind_all(entries: Iterable[Any], reuse_port: bool, *, listen: bool = True) -> dict[Any, socket.socket]:
    """Bind every entry, or none: on a failure the sockets already bound are closed."""
    bound: dict[Any, socket.socket] = {}
    for entry in entries:
        try:
            bound[entry] = bind(entry, reuse_port, listen=listen)
        except OSError as exc:
            for sock in bound.values():
                sock.close()
            raise BindFailed(f"bind() to {describe(entry)} failed ({exc.strerror or exc})") from None
    return bound


def check_bindable(entries: Iterable[Any]) -> None:
    """Raise BindFailed unless every entry can be bound now (bound without listening, then closed):
    the master of ``workers: N`` checks a new ``listen`` this way before any worker changes."""
    for sock in bind_all(entries, reuse_port=True, listen=False).values():
        sock.close()


class Listeners:
    """The sites of one ``web.ServerRunner``, one per ``listen`` entry."""

    def __init__(
        self,
        server: web.Server,
        reuse_port: bool,
        make_site: Callable[[Any, socket.socket], web.SockSite],
    ) -> None:
        self.server = server
        self.reuse_port = reuse_port
        self.make_site = make_site  # a plain or a TLS site, as the entry says
        self.sites: dict[Any, web.SockSite] = {}

    @property
    def entries(self) -> tuple[Any, ...]:
        return tuple(self.sites)

    def prepare(self, wanted: Iterable[Any]) -> dict[Any, socket.socket]:
        """Bind the entries of ``wanted`` not served yet; raises BindFailed (nothing changed)."""
        return bind_all([e for e in wanted if e not in self.sites], self.reuse_port)

    async def commit(self, wanted: Iterable[Any], fresh: dict[Any, socket.socket]) -> tuple[list[Any], list[Any]]:
        """Serve ``fresh`` and stop the listeners not in ``wanted``; returns (added, removed)."""
        keep = list(wanted)
        for entry, sock in fresh.items():
            site = self.make_site(entry, sock)
            await site.start()
            self.sites[entry] = site
        removed = [entry for entry in self.sites if entry not in keep]
        for entry in removed:
            await self._retire(entry)
        return list(fresh), removed

    async def _retire(self, entry: Any) -> None:
        site = self.sites.pop(entry)
        server = getattr(site, "_server", None)
        sockets = list(server.sockets) if server is not None else []
        local = [(str(name[0]), int(name[1])) for name in (s.getsockname() for s in sockets)]
        await site.stop()  # no more accepts; connections already accepted stay
        for conn in self.server.connections:
            transport = conn.transport
            sockname = transport.get_extra_info("sockname") if transport is not None else None
            if sockname is not None and any(_accepted_on(sockname, host, port) for host, port in local):
                _close_after_request(conn)


def _close_after_request(conn: Any) -> None:
    """Close a connection once its request in flight (if any) is answered; an idle one now."""
    conn.close()  # no further request is read; the handler's loop ends after the current one
    if not getattr(conn, "_request_in_progress", True) and not getattr(conn, "_messages", None):
        transport = conn.transport
        if transport is not None:
            transport.close()  # idle: aiohttp's close() only cancels its wait, leaving the socket open


def _accepted_on(sockname: Any, host: str, port: int) -> bool:
    """Whether a connection with this local address came in on the listener ``host:port``
    (a wildcard listener's connections carry the specific local address)."""
    return int(sockname[1]) == port and (host in ("0.0.0.0", "::") or str(sockname[0]) == host)
