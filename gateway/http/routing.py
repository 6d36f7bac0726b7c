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
(bad escape, ``..`` above the root, NUL byte) is a client error (400). So is one
that common backends would resolve to a path routed elsewhere (``;`` path
parameters, ``\\`` as a separator, double-encoded or overlong escapes): the
gateway routes on what the backend will see (docs/security.md).
"""

from __future__ import annotations

import importlib
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from gateway.http.pcre import compile_pcre

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
        return Location(kind=kind, value=value, pattern=compile_pcre(value, icase=kind == "regex_icase"))
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


# After one decoding, what a backend that decodes twice (or decodes overlong UTF-8, as old
# servers did) would read as a separator, a dot, a path parameter or NUL: refused, as no
# location can be chosen for what such a backend sees.
_SECOND_LEVEL = re.compile(rb"%(?:2[eEfF]|5[cC]|3[bB]|00)|[\xc0\xc1]|\xe0[\x80-\x9f]|\xf0[\x80-\x8f]")


def normalize_uri(raw_path: str) -> str:
    """Return nginx's ``$uri`` for a raw request path (no query string).

    Bytes that are not UTF-8 are kept as surrogate escapes so that matching never fails.
    Beyond nginx: an escape that still encodes a separator, dot, ``;`` or NUL once decoded
    (``%252e``), and overlong UTF-8 (``%c0%ae``), are refused (see docs/security.md).
    """
    if not raw_path.startswith("/"):
        raise BadURI("request target must start with '/'")
    if "%" in raw_path or not raw_path.isascii():
        data = _percent_decode(raw_path.encode("utf-8", "surrogateescape"))
        if b"\x00" in data:
            raise BadURI("NUL byte in URI")
        if _SECOND_LEVEL.search(data):
            raise BadURI("double-encoded or overlong escape in URI")
        path = data.decode("utf-8", "surrogateescape")
    elif "\x00" in raw_path:
        raise BadURI("NUL byte in URI")
    else:
        path = raw_path
    if "//" not in path and "/." not in path:
        return path
    return resolve_dots(path)


def resolve_dots(path: str) -> str:
    """Merge slashes and resolve ``.`` and ``..`` in a decoded path, as nginx does."""
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
    """The result of a lookup: a route, or a redirect target (auto-redirect), or nothing,
    or a refusal (400: a backend could read the URI as one that routes elsewhere)."""

    route: T | None
    redirect: str | None = None
    refused: str = ""


def backend_readings(uri: str) -> list[str]:
    """The other paths common backends resolve ``uri`` to, beyond nginx's own reading.

    * ``;`` starts a path parameter in each segment for Tomcat, Jetty and Spring:
      ``/admin;x=y`` is ``/admin`` to them, ``/public/..;/admin`` is ``/admin``;
    * ``\\`` is a separator for IIS, ASP.NET and WHATWG URL parsers (Node):
      ``/public\\..\\admin`` is ``/admin`` to them.

    Raises BadURI when a reading climbs above the root."""
    readings = []
    if ";" in uri:
        stripped = "/".join(segment.split(";", 1)[0] for segment in uri.split("/"))
        readings.append(resolve_dots(stripped))
    if "\\" in uri:
        slashed = uri.replace("\\", "/")
        readings.append(resolve_dots(slashed))
        if ";" in uri:
            readings.append(resolve_dots("/".join(segment.split(";", 1)[0] for segment in slashed.split("/"))))
    return readings


class LocationTable(Generic[T]):
    """Locations compiled for lookup; ``T`` is whatever the caller attaches (a route plan).

    The order is nginx's (see the module docstring); the data structures are chosen so that
    a table of thousands of locations costs about what a table of one does:

    * the longest prefix is one dict probe per distinct prefix length, not one
      ``startswith`` per location;
    * a regex anchored on a literal (``^/api/``, ``\\.php$``) is searched only for a URI
      that has that literal, found by a dict probe; the others are searched in chunks, each
      chunk one alternation (:class:`_RegexSet`): the same answer as trying them one by one;
    * the decision for a URI is remembered in a bounded cache (:class:`_DecisionCache`), as
      it depends on nothing but the URI and this table (a reload builds a new table).
    """

    def __init__(self, entries: Sequence[tuple[Location, T]], *, cache_size: int = 4096) -> None:
        self._exact: dict[str, Match[T]] = {}
        prefixes: dict[str, tuple[bool, Match[T]]] = {}
        regexes: list[tuple[re.Pattern[str], Match[T]]] = []
        for location, item in entries:
            if location.kind == "exact":
                self._exact.setdefault(location.value, Match(item))
            elif location.kind in ("prefix", "prefix_noregex"):
                # the first of two equal prefixes wins, as it did in a stable sort by length
                prefixes.setdefault(location.value, (location.kind == "prefix_noregex", Match(item)))
            else:
                assert location.pattern is not None
                regexes.append((location.pattern, Match(item)))
        self._prefixes = prefixes
        # Longest first, so the first hit is the longest match.
        self._lengths = tuple(sorted({len(value) for value in prefixes}, reverse=True))
        self._slashed = {value[:-1] for value in prefixes if value.endswith("/") and len(value) > 1}
        self._regexes = _RegexSet(regexes) if regexes else None
        self._none: Match[T] = Match(None)
        # A table of a few prefixes and no regex decides faster than a cache would answer.
        small = not regexes and len(self._lengths) <= 8
        self._cache = None if small or cache_size <= 0 else _DecisionCache[Match[T]](cache_size)

    def match(self, uri: str) -> Match[T]:
        cache = self._cache
        if cache is None:
            return self._decide(uri) if ";" not in uri and "\\" not in uri else self._unambiguous(uri)
        found = cache.get(uri)
        if found is None:
            found = self._decide(uri) if ";" not in uri and "\\" not in uri else self._unambiguous(uri)
            cache.put(uri, found)
        return found

    def _unambiguous(self, uri: str) -> Match[T]:
        """The decision for ``uri``, unless a backend's reading of it (``backend_readings``)
        would be decided otherwise: then a refusal, as no one location holds for it."""
        found = self._decide(uri)
        try:
            readings = backend_readings(uri)
        except BadURI:
            return Match(None, refused="a backend reads this URI as above the root")
        for reading in readings:
            other = self._decide(reading)
            if other.route is not found.route or other.redirect != found.redirect:
                return Match(None, refused="a backend reads this URI as one routed elsewhere")
        return found

    def _decide(self, uri: str) -> Match[T]:
        exact = self._exact.get(uri)
        if exact is not None:
            return exact
        best: tuple[bool, Match[T]] | None = None
        size = len(uri)
        prefixes = self._prefixes
        for length in self._lengths:
            if length <= size:
                best = prefixes.get(uri[:length])
                if best is not None:
                    break
        if uri in self._slashed:
            return Match(None, redirect=uri + "/")
        if best is not None and best[0]:
            return best[1]
        if self._regexes is not None:
            found = self._regexes.first(uri)
            if found is not None:
                return found
        if best is not None:
            return best[1]
        return self._none


_CHUNK = 32  # regexes per alternation: the cost of finding the first one of a chunk is bounded by it
# What a location regex may not contain to be searched inside an alternation: group references
# by number or name, conditionals (their group numbers shift once wrapped), named groups (two
# locations may use the same name) and flags for the whole pattern such as (?x) or (?i) at the start.
_UNSHAREABLE = re.compile(r"\\[1-9]|\\g<|\(\?P[=<]|\(\?\(|\(\?[aiLmsux]+\)")
_OWN_FLAGS = re.IGNORECASE  # the only flag parse_location sets; any other came from the pattern itself


class _RegexSet(Generic[T]):
    """Regular expressions in configuration order; :meth:`first` returns the first that matches.

    Two ways to skip most of them without changing the answer:

    * **anchored literals**: a regex that starts with ``^`` and literal characters (``^/api/v``)
      can only match a URI that starts with them; one that ends with literal characters and
      ``$`` (``\\.php$``) only one that ends with them (or with them and a newline). Such
      regexes are indexed by that literal, and a URI probes the index once per literal length
      (case-insensitive ones by the lower-cased URI, when it is ASCII; otherwise they are all
      tried). Only the candidates found are searched.
    * **alternations**: the other regexes are joined, ``_CHUNK`` at a time, into one
      alternation ``(?P<_0>re0)|(?P<_1>(?i:re1))|...``. An alternation that finds nothing
      proves that none of its members matches anywhere in the URI. When it finds something,
      it names the member that matched at the leftmost position, which is not always the
      first in configuration order: the members before it are then tried one by one, and the
      first of them that matches wins, else the named one. A regex that cannot be wrapped
      without changing its meaning (see ``_UNSHAREABLE``) is searched on its own.

    The answer is the earliest, in configuration order, of the first match among the
    alternations and the candidates of the index: the same as trying every regex in turn.
    """

    def __init__(self, regexes: Sequence[tuple[re.Pattern[str], Match[T]]]) -> None:
        self._patterns = tuple(pattern for pattern, _ in regexes)
        self._items = tuple(item for _, item in regexes)
        # literal -> indices, for: start case-sensitive, start lower-cased, end ..., end ...
        maps: tuple[dict[str, list[int]], ...] = ({}, {}, {}, {})
        icase: list[int] = []
        chunks: list[tuple[re.Pattern[str], tuple[tuple[re.Pattern[str], int], ...]]] = []
        run: list[tuple[re.Pattern[str], int]] = []

        def close() -> None:
            combined = _alternation([p for p, _ in run]) if len(run) > 1 else None
            if combined is not None:
                chunks.append((combined, tuple(run)))
            else:  # one regex, or an alternation Python refuses: each on its own
                chunks.extend((p, ((p, index),)) for p, index in run)
            run.clear()

        for index, pattern in enumerate(self._patterns):
            literal = _anchored_literal(pattern)
            if literal is not None:
                at_end, text, folded = literal
                maps[2 * at_end + folded].setdefault(text, []).append(index)
                if folded:
                    icase.append(index)
            elif _shareable(pattern):
                run.append((pattern, index))
                if len(run) == _CHUNK:
                    close()
            else:
                close()
                chunks.append((pattern, ((pattern, index),)))
        close()
        self._chunks = tuple(chunks)
        self._maps = tuple((m, tuple(sorted({len(k) for k in m}))) for m in maps)
        self._icase = tuple(icase)
        self._indexed = any(maps)

    def first(self, uri: str) -> Match[T] | None:
        best = self._first_free(uri)
        if self._indexed:
            candidates = self._candidates(uri, best)
            if candidates:
                candidates.sort()
                patterns = self._patterns
                for index in candidates:
                    if patterns[index].search(uri):
                        return self._items[index]
        return self._items[best] if best >= 0 else None

    def _candidates(self, uri: str, before: int) -> list[int]:
        """The indexed regexes whose literal the URI has (those before ``before``, if it is >= 0)."""
        found: list[int] = []
        size = len(uri)
        lower = uri.lower() if uri.isascii() else None
        newline = uri.endswith("\n")
        for kind, (table, lengths) in enumerate(self._maps):
            if not table:
                continue
            folded = kind & 1
            if folded and lower is None:
                continue  # not ASCII: every case-insensitive one is a candidate (below)
            text = lower if folded else uri
            assert text is not None
            for length in lengths:
                if length > size:
                    break
                if kind < 2:
                    hit = table.get(text[:length])
                else:
                    hit = table.get(text[size - length :])
                    if newline and hit is None and length < size:
                        hit = table.get(text[size - length - 1 : size - 1])  # $ matches before a final newline
                if hit is not None:
                    found += hit
        if lower is None:
            found += self._icase
        if before >= 0:
            found = [index for index in found if index < before]
        return found

    def _first_free(self, uri: str) -> int:
        """The index of the first regex outside the index that matches, or -1."""
        for combined, members in self._chunks:
            found = combined.search(uri)
            if found is None:
                continue
            if len(members) == 1:
                return members[0][1]
            name = found.lastgroup  # the member's group: it encloses, so closes after, any of its own
            last = int(name[1:]) if name is not None else len(members) - 1
            for pattern, index in members[:last]:
                if pattern.search(uri):
                    return index
            if name is not None or members[last][0].search(uri):
                return members[last][1]
        return -1


def _anchored_literal(pattern: re.Pattern[str]) -> tuple[int, str, int] | None:
    """(1 if at the end else 0, the literal, 1 if case-insensitive else 0), or None.

    ``^lit...`` or ``...lit$`` / ``...lit\\Z`` at the top level of the pattern, from Python's
    own parse of it; None when unsure (other flags, a top-level alternation, no literal)."""
    flags = pattern.flags & ~re.UNICODE
    if flags & ~re.IGNORECASE or _PARSER is None:
        return None
    try:
        items = list(_PARSER.parse(pattern.pattern, pattern.flags))
    except Exception:  # a private module: any surprise means no index, not a failure
        return None
    if len(items) < 2:
        return None
    folded = 1 if flags & re.IGNORECASE else 0
    first, last = items[0], items[-1]
    if str(first[0]) == "AT" and str(first[1]) in ("AT_BEGINNING", "AT_BEGINNING_STRING"):
        run = items[1:]
        at_end = 0
    elif str(last[0]) == "AT" and str(last[1]) in ("AT_END", "AT_END_STRING"):
        run = items[-2::-1]
        at_end = 1
    else:
        return None
    chars: list[str] = []
    for op, value in run:
        if str(op) != "LITERAL":
            break
        chars.append(chr(value))
    if not chars:
        return None
    text = "".join(chars if not at_end else reversed(chars))
    if folded:
        if not text.isascii():
            return None
        text = text.lower()
    return at_end, text, folded


try:
    _PARSER: Any = importlib.import_module("re._parser")  # the parser re.compile itself uses
except ImportError:  # pragma: no cover (older or other Pythons: no index, the same answers)
    _PARSER = None


def _shareable(pattern: re.Pattern[str]) -> bool:
    return not (pattern.flags & ~(_OWN_FLAGS | re.UNICODE)) and not _UNSHAREABLE.search(pattern.pattern)


def _alternation(patterns: Sequence[re.Pattern[str]]) -> re.Pattern[str] | None:
    parts = []
    for index, pattern in enumerate(patterns):
        body = f"(?i:{pattern.pattern})" if pattern.flags & re.IGNORECASE else f"(?:{pattern.pattern})"
        parts.append(f"(?P<_{index}>{body})")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # each member already compiled on its own, and warned then
        try:
            return re.compile("|".join(parts))
        except re.error:
            return None


V = TypeVar("V")


class _DecisionCache(Generic[V]):
    """A bounded memo from a URI to its decision: two generations of at most ``size`` entries.

    Lookups read the young generation, then the old one (a hit there moves the entry back
    to the young one). When the young generation is full it becomes the old one and the
    previous old one is dropped whole, so a flood of distinct URIs costs one dict insert per
    request and at most ``2 * size`` entries, and the URIs in steady use stay cached. URIs
    longer than ``max_key`` are decided every time rather than kept.
    """

    __slots__ = ("_old", "_size", "_young", "max_key")

    def __init__(self, size: int, max_key: int = 256) -> None:
        self._size = size
        self._young: dict[str, V] = {}
        self._old: dict[str, V] = {}
        self.max_key = max_key

    def get(self, key: str) -> V | None:
        value = self._young.get(key)
        if value is None:
            value = self._old.get(key)
            if value is not None:
                self.put(key, value)
        return value

    def put(self, key: str, value: V) -> None:
        if len(key) > self.max_key:
            return
        young = self._young
        if len(young) >= self._size:
            self._old = young
            self._young = young = {}
        young[key] = value

    def __len__(self) -> int:
        return len(self._young) + len(self._old)
