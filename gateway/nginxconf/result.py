"""What one translation produces: the gateway document, its servers and routes, and what was skipped.

Every directive ends up in exactly one place: translated into ``Result.doc`` (or a
server's routes), or listed in ``Result.skipped`` with its file:line and the reason.
``Result.notes`` lists what was translated with a difference from nginx.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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

    def skip(self, d: Directive, reason: str) -> None:
        self.skipped.append(Skipped(d.where, d.text(), reason))

    def note(self, text: str) -> None:
        self.notes.append(text)
