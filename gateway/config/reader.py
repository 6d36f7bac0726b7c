"""Typed accessors over a parsed document that collect errors instead of stopping.

Schema parsers call these with the key path of the value they want; a wrong
value records an error at that path (with its line) and returns ``None`` or a
default, so one run of ``gateway check`` reports every mistake in a file.
"""

from __future__ import annotations

import difflib
import ipaddress
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from gateway.config.source import MAX_ERRORS, Document
from gateway.config.units import parse_duration_ms, parse_size
from gateway.errors import ConfigError, KeyPath
from gateway.http.keys import NO_DEFINED, Defined

T = TypeVar("T")
_MISSING = object()


class Reader:
    def __init__(self, doc: Document) -> None:
        self.doc = doc
        self.errors: list[ConfigError] = []
        self.warnings: list[ConfigError] = []
        # the variables ``maps:`` and ``geo:`` define: parsed first, then every template may use them
        self.defined: Defined = NO_DEFINED

    # -- reporting -------------------------------------------------------------
    def error(self, path: KeyPath, message: str, *, at_key: bool = False) -> None:
        if len(self.errors) > MAX_ERRORS:
            return
        if len(self.errors) == MAX_ERRORS:
            message = f"more than {MAX_ERRORS} errors: the rest are not shown"
        self.errors.append(self.doc.error(path, message, at_key=at_key))

    @property
    def full(self) -> bool:
        """No more errors will be shown: skip the work of explaining them."""
        return len(self.errors) > MAX_ERRORS

    def warn(self, path: KeyPath, message: str) -> None:
        self.warnings.append(self.doc.error(path, message))

    # -- structure -------------------------------------------------------------
    def mapping(
        self,
        value: Any,
        path: KeyPath,
        allowed: Iterable[str],
        required: Iterable[str] = (),
        what: str = "a mapping",
    ) -> dict[str, Any] | None:
        """Check that ``value`` is a mapping with only ``allowed`` keys and all ``required`` ones."""
        if not isinstance(value, dict):
            self.error(path, f"expected {what}, got {_describe(value)}")
            return None
        allowed = tuple(allowed)
        for key in value:
            if key not in allowed:
                hint = [] if self.full else difflib.get_close_matches(key, allowed, n=1)
                suffix = f' (did you mean "{hint[0]}"?)' if hint else ""
                self.error(path + (key,), f"unknown key {key!r}{suffix}", at_key=True)
        for key in required:
            if key not in value:
                self.error(path, f"missing required key {key!r}")
        return value

    def sequence(self, value: Any, path: KeyPath, *, allow_scalar: bool = False) -> list[Any]:
        """A list; a single scalar is accepted as a one-element list when ``allow_scalar``."""
        if isinstance(value, list):
            return value
        if allow_scalar and value is not None and not isinstance(value, dict):
            return [value]
        self.error(path, f"expected a list, got {_describe(value)}")
        return []

    # -- scalars ---------------------------------------------------------------
    def field(
        self,
        data: dict[str, Any],
        key: str,
        path: KeyPath,
        parse: Callable[[Any], T],
        default: T | object = _MISSING,
    ) -> T | None:
        """Parse ``data[key]`` with ``parse`` (which raises ValueError with an operator message)."""
        if key not in data:
            if default is _MISSING:
                return None
            return default  # type: ignore[return-value]
        try:
            return parse(data[key])
        except ValueError as exc:
            self.error(path + (key,), str(exc))
            return None


# -- value parsers (raise ValueError) ------------------------------------------------------


def _describe(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    return f"{value!r}"


def as_str(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {_describe(value)}")
    return value


def as_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {_describe(value)}")
    return value


def int_in(low: int, high: int, what: str = "value") -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {_describe(value)}")
        if not low <= value <= high:
            raise ValueError(f"invalid {what} {value}: must be between {low} and {high}")
        return value

    return parse


def status_code(value: Any) -> int:
    """nginx's ``*_status`` rule: 400..599."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an HTTP status code, got {_describe(value)}")
    if not 400 <= value <= 599:
        raise ValueError(f"value must be between 400 and 599, got {value}")
    return value


def duration_ms(value: Any) -> int:
    return parse_duration_ms(value)


def positive_duration_ms(value: Any) -> int:
    ms = parse_duration_ms(value)
    if ms <= 0:
        raise ValueError(f"must be greater than zero, got {value!r}")
    return ms


MAX_ZONE_SIZE = 64 * 1024**3  # 64g of limit state is far beyond what one node's memory should hold


def size(value: Any) -> int:
    """A size of at most 1024g (``MAX_SIZE``): ``client_max_body_size``."""
    return parse_size(value)


def zone_size(value: Any) -> int:
    """A zone's ``size``: at most 64g."""
    return parse_size(value, MAX_ZONE_SIZE)


def one_of(*choices: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}; got {_describe(value)}")
        return str(value)

    return parse


def network(value: Any) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """An address or CIDR (``10.0.0.0/8``, ``::1``); host bits are allowed, like nginx."""
    if not isinstance(value, str):
        raise ValueError(f"expected an IP address or CIDR, got {_describe(value)}")
    try:
        return ipaddress.ip_network(value.strip(), strict=False)
    except ValueError:
        raise ValueError(f"invalid address or CIDR {value!r}") from None


def host_port(default_port: int | None = None) -> Callable[[Any], tuple[str, int]]:
    """``host:port``, ``[v6]:port``, ``:port`` or a bare port; host may be a name."""

    def parse(value: Any) -> tuple[str, int]:
        if isinstance(value, int) and not isinstance(value, bool):
            return ("0.0.0.0", _port(value))
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"expected host:port, got {_describe(value)}")
        text = value.strip()
        if text.isdigit():
            return ("0.0.0.0", _port(int(text)))
        if text.startswith("["):
            end = text.find("]")
            if end < 0:
                raise ValueError(f"invalid address {value!r}: missing ']'")
            host, rest = text[1:end], text[end + 1 :]
            try:
                ipaddress.IPv6Address(host)
            except ValueError:
                raise ValueError(f"invalid IPv6 address in {value!r}") from None
            if not rest:
                port = default_port
            elif rest.startswith(":") and rest[1:].isdigit():
                port = int(rest[1:])
            else:
                raise ValueError(f"invalid address {value!r}")
        else:
            host, sep, port_text = text.rpartition(":")
            if not sep:
                host, port_text = text, ""
            if ":" in host:
                raise ValueError(f"invalid address {value!r}: write IPv6 addresses as [addr]:port")
            if port_text == "":
                port = default_port
            elif port_text.isdigit():
                port = int(port_text)
            else:
                raise ValueError(f"invalid port in {value!r}")
            host = host or "0.0.0.0"
        if port is None:
            raise ValueError(f"missing port in {value!r}")
        return (host, _port(port))

    return parse


def _port(port: int) -> int:
    if not 0 < port < 65536:
        raise ValueError(f"invalid port {port}: must be 1..65535")
    return port
