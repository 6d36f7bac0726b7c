"""What one translation produces: the gateway document, its servers and routes, and what was skipped.

Every directive ends up in exactly one place: translated into ``Result.doc`` (or a
server's routes), or listed in ``Result.skipped`` with its file:line and the reason.
``Result.notes`` lists what was translated with a difference from nginx, ``Result.same``
the directives that need no key because the gateway already behaves so. A directive is
listed once, however many routes inherit it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.http.keys import NO_DEFINED, Defined
from gateway.nginxconf.parser import Directive

Doc = dict[str, Any]


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
    comments: list[str] = field(default_factory=list)  # written above the route


@dataclass(slots=True)
class Server:
    where: str
    names: list[str] = field(default_factory=list)
    listen: list[str] = field(default_factory=list)
    default: bool = False
    routes: list[Route] = field(default_factory=list)
    tls: Doc = field(default_factory=dict)  # the server's own ssl_* keys
    rules: list[Doc] = field(default_factory=list)  # its if-return guards, before a location is chosen
    access: list[Doc] | None = None  # the server's own allow/deny list (None: the http level's)


@dataclass(slots=True)
class Result:
    doc: Doc = field(default_factory=dict)
    servers: list[Server] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    same: dict[str, list[str]] = field(default_factory=dict)  # directive text -> where it is
    refused: list[str] = field(default_factory=list)  # routes that refuse every request, and why
    listen_no_ops: set[str] = field(default_factory=set)  # listen parameters accepted with nothing to do
    non_http: bool = False  # a location was skipped for serving by FastCGI, uwsgi...
    fatal: str = ""  # why there is no configuration to write (the import exits 1)
    listed: set[tuple[str, str]] = field(default_factory=set)  # (where, text) already skipped
    defined: Defined = NO_DEFINED  # the variables the map and geo blocks translated define

    def skip(self, d: Directive, reason: str) -> None:
        key = (d.where, d.text())
        if key in self.listed:
            return  # inherited by several routes: listed once, with the first reason
        self.listed.add(key)
        self.skipped.append(Skipped(d.where, d.text(), reason))

    def skipped_server(self, srv: Server, reason: str) -> None:
        """A server (or some of its listens) left out by the last pass."""
        self.skipped.append(Skipped(srv.where, "server { ... }", reason))

    def dropped_key(self, text: str, reason: str) -> None:
        self.skipped.append(Skipped("-", text, reason))

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def same_here(self, d: Directive) -> None:
        """``d`` does what the gateway does anyway (or nothing, as the gateway serves no files)."""
        wheres = self.same.setdefault(d.text(), [])
        if d.where not in wheres:
            wheres.append(d.where)

    def same_line(self) -> str:
        return "; ".join(f"{text} ({len(w)}x)" if len(w) > 1 else f"{text} ({w[0]})" for text, w in self.same.items())
