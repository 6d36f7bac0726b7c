"""The gateway's exception tree.

Load-time errors carry a location (file, line, column, key path) so that
``gateway check`` can print them like ``nginx -t`` does. Runtime errors are few
and caught at the two I/O boundaries of the request path: the store and the
upstream.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

KeyPath = tuple[str | int, ...]


def format_path(path: KeyPath) -> str:
    """Render a key path the way it reads in YAML: ``routes[2].limit_req[0].zone``."""
    out: list[str] = []
    for part in path:
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif out:
            out.append(f".{part}")
        else:
            out.append(part)
    return "".join(out) or "(top level)"


class GatewayError(Exception):
    """Base class of every error the gateway raises on purpose."""


class ConfigError(GatewayError):
    """One problem in a configuration file, with where it is."""

    def __init__(
        self,
        message: str,
        *,
        file: str = "",
        line: int = 0,
        column: int = 0,
        path: KeyPath = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.line = line
        self.column = column
        self.path = path

    def __str__(self) -> str:
        where = self.file or "<config>"
        if self.line:
            where = f"{where}:{self.line}:{self.column}"
        return f"{where}: {format_path(self.path)}: {self.message}"


class ConfigErrors(GatewayError):
    """Every problem found in one load, sorted by position."""

    def __init__(self, errors: Iterable[ConfigError]) -> None:
        self.errors: Sequence[ConfigError] = sorted(
            errors, key=lambda e: (e.file, e.line, e.column, format_path(e.path))
        )
        super().__init__("\n".join(str(e) for e in self.errors))


class StoreUnavailable(GatewayError):
    """The shared store (Redis) did not answer in time or answered with an error."""


class ScriptsMissing(GatewayError):
    """The installed gateway has no Lua scripts: a packaging fault, not a Redis outage."""


class UpstreamError(GatewayError):
    """The upstream refused, reset or otherwise failed the exchange (-> 502)."""


class UpstreamTimeout(UpstreamError):
    """The upstream did not connect or answer in time (-> 504)."""


class BanStoreError(GatewayError):
    """The embedded store's ban database cannot be opened, read or written (its path is named)."""
