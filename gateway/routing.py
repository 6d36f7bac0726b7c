"""nginx ``location`` syntax, URI normalisation and matching order.

Order, as in ``ngx_http_core_find_location``:

1. an exact location (``= /x``) equal to the URI wins at once;
2. otherwise the longest matching prefix location is remembered; if it is
   ``^~``, it wins without looking at regular expressions;
3. if the URI plus ``/`` names a prefix location (``/api`` vs ``/api/``) and that
   is the best static match, the answer is a 301 to the slashed URI (nginx's
   auto-redirect for proxied locations);
4. regular expressions (``~`` case-sensitive, ``~*`` case-insensitive) are tried in
   configuration order; the first match wins;
5. otherwise the remembered prefix wins; with none, there is no route (404).

URIs are matched after nginx-style normalisation: percent-decoding, merging of
slashes and resolution of ``.`` and ``..``. A URI that cannot be normalised
(bad escape, ``..`` above the root, NUL byte) is a client error (400).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

KINDS = ("prefix", "exact", "prefix_noregex", "regex", "regex_icase")
_MODIFIERS = {"=": "exact", "^~": "prefix_noregex", "~": "regex", "~*": "regex_icase"}


@dataclass(frozen=True, slots=True)
class Location:
    kind: str  # one of KINDS
    value: str
    pattern: re.Pattern[str] | None = None

    def __str__(self) -> str:
        modifier = {v: k for k, v in _MODIFIERS.items()}.get(self.kind)
        return f"{modifier} {self.value}" if modifier else self.value


def _pcre_to_python(regex: str) -> str:
    # PCRE named groups (?<name>...) are spelled (?P<name>...) in Python.
    return re.sub(r"\(\?<(?=[A-Za-z_])", "(?P<", regex)


def parse_location(text: object) -> Location:
    """Parse ``/p``, ``= /x``, ``^~ /p``, ``~ re`` or ``~* re`` (raises ValueError)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"expected a location such as /api/ or '~ \\.php$', got {text!r}")
    raw = text.strip()
    kind = "prefix"
    value = raw
    for modifier in ("~*", "^~", "=", "~"):
        if raw.startswith(modifier):
            kind = _MODIFIERS[modifier]
            value = raw[len(modifier) :].strip()
            break
    if not value:
        raise ValueError(f"location {text!r} has a modifier but no path or pattern")
    if kind in ("regex", "regex_icase"):
        flags = re.IGNORECASE if kind == "regex_icase" else 0
        try:
            pattern = re.compile(_pcre_to_python(value), flags)
        except re.error as exc:
            raise ValueError(f"invalid regular expression {value!r}: {exc}") from None
        return Location(kind=kind, value=value, pattern=pattern)
    if not value.startswith("/"):
        raise ValueError(f"location path {value!r} must start with '/'")
    return Location(kind=kind, value=value)


class BadURI(ValueError):
    """The request target cannot be normalised; answer 400."""


_HEX = frozenset(b"0123456789abcdefABCDEF")


def _percent_decode(data: bytes) -> bytes:
    out = bytearray()
    pos = 0
    while True:
        cut = data.find(b"%", pos)
        if cut < 0:
            out += data[pos:]
            return bytes(out)
        out += data[pos:cut]
        digits = data[cut + 1 : cut + 3]
        if len(digits) != 2 or digits[0] not in _HEX or digits[1] not in _HEX:
            raise BadURI("invalid percent-escape in URI")
        out.append(int(digits, 16))
        pos = cut + 3


def normalize_uri(raw_path: str) -> str:
    """Return nginx's ``$uri`` for a raw request path (no query string).

    Bytes that are not UTF-8 are kept as surrogate escapes so that matching never fails.
    """
    if not raw_path.startswith("/"):
        raise BadURI("request target must start with '/'")
    if "%" in raw_path:
        data = _percent_decode(raw_path.encode("utf-8", "surrogateescape"))
        if b"\x00" in data:
            raise BadURI("NUL byte in URI")
        path = data.decode("utf-8", "surrogateescape")
    elif "\x00" in raw_path:
        raise BadURI("NUL byte in URI")
    else:
        path = raw_path
    if "//" not in path and "/." not in path:
        return path
    segments: list[str] = []
    parts = path.split("/")
    for index, segment in enumerate(parts[1:], start=1):
        last = index == len(parts) - 1
        if segment == "" and not last:
            continue  # merge slashes
        if segment in (".", ".."):
            if segment == "..":
                if not segments:
                    raise BadURI("'..' above the root")
                segments.pop()
            if last:
                segments.append("")
            continue
        segments.append(segment)
    return "/" + "/".join(segments)


@dataclass(frozen=True, slots=True)
class Match(Generic[T]):
    """The result of a lookup: a route, or a redirect target (auto-redirect), or nothing."""

    route: T | None
    redirect: str | None = None


class LocationTable(Generic[T]):
    """Locations compiled for lookup; ``T`` is whatever the caller attaches (a route plan)."""

    def __init__(self, entries: Sequence[tuple[Location, T]]) -> None:
        self._exact: dict[str, T] = {}
        prefixes: list[tuple[str, bool, T]] = []
        self._regexes: list[tuple[re.Pattern[str], T]] = []
        for location, item in entries:
            if location.kind == "exact":
                self._exact.setdefault(location.value, item)
            elif location.kind in ("prefix", "prefix_noregex"):
                prefixes.append((location.value, location.kind == "prefix_noregex", item))
            else:
                assert location.pattern is not None
                self._regexes.append((location.pattern, item))
        # Longest first, so the first hit is the longest match.
        prefixes.sort(key=lambda p: len(p[0]), reverse=True)
        self._prefixes = tuple(prefixes)
        self._slashed = {value[:-1] for value, _, _ in prefixes if value.endswith("/") and len(value) > 1}

    def match(self, uri: str) -> Match[T]:
        item = self._exact.get(uri)
        if item is not None:
            return Match(item)
        best: tuple[str, bool, T] | None = None
        for prefix in self._prefixes:
            if uri.startswith(prefix[0]):
                best = prefix
                break
        if uri in self._slashed:
            return Match(None, redirect=uri + "/")
        if best is not None and best[1]:
            return Match(best[2])
        for pattern, regex_item in self._regexes:
            if pattern.search(uri):
                return Match(regex_item)
        if best is not None:
            return Match(best[2])
        return Match(None)
