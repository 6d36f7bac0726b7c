"""nginx's ``map`` and ``geo`` variables, compiled once per load into lookups.

A map's lookup, in nginx's order:

1. exact keys: one dict probe on the source lower-cased (nginx compares keys ignoring
   ASCII case);
2. with ``hostnames`` (the source then loses one trailing dot): the longest wildcard
   ``*.example.com`` / ``.example.com`` (one probe per dot of the source), then the longest
   ``www.example.*``;
3. the regexes, in the order written, on the source as it is; the first that matches wins,
   and its captures (``$1``..``$9``, named ones) are variables of its value. An empty source
   tries no regex;
4. ``default`` ("" when there is none).

A geo is a longest-prefix match: one dict per prefix length present, longest first, as the ban
table does; with ``ranges``, a bisection over sorted disjoint IPv4 ranges. Its address is the
client's (after real_ip) unless a ``source`` is given; a source that is not an address is
looked up as 255.255.255.255, and with ``ranges`` so is an IPv6 address, as nginx does.

Values are bytes, as keys are. A variable is computed when a request first needs it; one that
the configuration uses in more than one place keeps its value in the request context
(``RequestContext.variables``), so it is computed at most once per request.
"""

from __future__ import annotations

import bisect
import itertools
import re
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING

from gateway.http.keys import KeyFn, KeyTemplate, compile_text, longest_key

if TYPE_CHECKING:
    from gateway.config.maps import GeoSpec, MapSpec
    from gateway.http.context import RequestContext

Match = re.Match[bytes]
CaptureFn = Callable[["RequestContext", Match], bytes]
MapValue = bytes | KeyFn  # a constant, or a function of the request
RegexValue = bytes | CaptureFn  # a regex's value: a constant, or a function of the request and the match
NONE_V4 = 0xFFFFFFFF  # INADDR_NONE: what nginx looks up for an address it cannot use
_MASKS = {
    (v, p): ((1 << bits) - 1) ^ ((1 << (bits - p)) - 1) for v, bits in ((4, 32), (6, 128)) for p in range(bits + 1)
}
_tokens = itertools.count(1)


class MapTable:
    """One map's keys, in the structures its lookup probes."""

    def __init__(
        self,
        *,
        exact: Mapping[bytes, MapValue],
        default: MapValue,
        hostnames: bool = False,
        heads: Mapping[bytes, MapValue] | None = None,
        tails: Mapping[bytes, MapValue] | None = None,
        regexes: Sequence[tuple[re.Pattern[bytes], RegexValue]] = (),
    ) -> None:
        self.exact = dict(exact)
        self.default = default
        self.hostnames = hostnames
        self.heads = dict(heads or {})
        self.tails = dict(tails or {})
        self.regexes = tuple(regexes)
        # keys without ASCII letters match the source as it is: no need to lower-case it
        self.fold = any(key != key.lower() or key != key.upper() for key in self.exact)

    def find(self, source: bytes) -> tuple[MapValue | RegexValue, Match | None]:
        """The value that wins for ``source``, and the match of its regex (None for the others:
        then the value is not a regex's)."""
        if self.hostnames and source.endswith(b"."):
            source = source[:-1]
        folded = source.lower()
        value = self.exact.get(folded if self.fold else source)
        if value is not None:
            return value, None
        if self.heads:
            at = folded.find(b".")
            while at >= 0:
                value = self.heads.get(folded[at + 1 :])
                if value is not None:
                    return value, None
                at = folded.find(b".", at + 1)
        if self.tails:
            at = folded.rfind(b".")
            while at > 0:
                value = self.tails.get(folded[:at])
                if value is not None:
                    return value, None
                at = folded.rfind(b".", 0, at)
        if source:
            for pattern, regex_value in self.regexes:
                match = pattern.search(source)
                if match is not None:
                    return regex_value, match
        return self.default, None

    def lookup_fn(self, source: KeyFn) -> KeyFn:
        """The map as a function of the request: a bare dict probe when the map has only exact keys."""
        if self.hostnames or self.heads or self.tails or self.regexes:
            find = self.find

            def lookup(ctx: RequestContext) -> bytes:
                value, match = find(source(ctx))
                if isinstance(value, bytes):
                    return value
                if match is not None:
                    return value(ctx, match)  # type: ignore[call-arg]
                return value(ctx)  # type: ignore[call-arg]

            return lookup
        get = self.exact.get
        default = self.default
        if self.fold:

            def folded(ctx: RequestContext) -> bytes:
                value = get(source(ctx).lower(), default)
                return value if value.__class__ is bytes else value(ctx)  # type: ignore[operator]

            return folded

        def exact(ctx: RequestContext) -> bytes:
            value = get(source(ctx), default)
            return value if value.__class__ is bytes else value(ctx)  # type: ignore[operator]

        return exact


class GeoTable:
    """One geo's networks (longest prefix first) or ranges, and its default."""

    def __init__(
        self,
        default: bytes,
        networks: Sequence[tuple[int, int, int, bytes]] = (),  # (version, prefix length, network, value)
        ranges: Sequence[tuple[int, int, bytes]] | None = None,  # disjoint (first, last, value), IPv4
    ) -> None:
        self.default = default
        by_len: dict[tuple[int, int], dict[int, bytes]] = {}
        for version, plen, net, value in networks:
            by_len.setdefault((version, plen), {})[net & _MASKS[(version, plen)]] = value  # the last wins
        self.tables = {
            version: tuple(
                (_MASKS[(version, plen)], by_len[(version, plen)])
                for plen in sorted((p for v, p in by_len if v == version), reverse=True)
            )
            for version in (4, 6)
        }
        self.ranged = ranges is not None
        spans = sorted(ranges or ())
        self.starts = [first for first, _, _ in spans]
        self.spans = spans

    def find(self, version: int, value: int) -> bytes:
        """The value for an address (``version`` 4 or 6, anything else: not an address)."""
        if self.ranged:
            if version != 4:
                value = NONE_V4
            i = bisect.bisect_right(self.starts, value) - 1
            if i >= 0:
                _, last, found = self.spans[i]
                if value <= last:
                    return found
            return self.default
        if version not in (4, 6):
            version, value = 4, NONE_V4
        for mask, nets in self.tables[version]:
            found_net = nets.get(value & mask)
            if found_net is not None:
                return found_net
        return self.default

    def lookup_fn(self, source: KeyFn | None) -> KeyFn:
        """The geo as a function of the request: of the client's address, or of ``source``'s text."""
        find = self.find
        if source is None:
            return lambda ctx: find(ctx.client.version, ctx.client.value)

        def lookup(ctx: RequestContext) -> bytes:
            return find(*address_of(source(ctx)))

        return lookup


def address_of(text: bytes) -> tuple[int, int]:
    """(4 or 6, the address as an int) of an address in text; (0, 0) when it is not one.
    An IPv4-mapped IPv6 address is its IPv4 address."""
    try:
        stripped = text.decode("ascii").strip()
    except UnicodeDecodeError:
        return 0, 0
    family, version = (socket.AF_INET6, 6) if ":" in stripped else (socket.AF_INET, 4)
    try:
        value = int.from_bytes(socket.inet_pton(family, stripped), "big")
    except (OSError, ValueError):
        return 0, 0
    if version == 6 and value >> 32 == 0xFFFF:
        return 4, value & 0xFFFFFFFF
    return version, value


def _cached(fn: KeyFn) -> KeyFn:
    """``fn`` computed at most once per request: its value is kept in the request context."""
    token = next(_tokens)

    def once(ctx: RequestContext) -> bytes:
        memo = ctx.variables
        if memo is None:
            value = fn(ctx)
            ctx.variables = {token: value}
            return value
        kept = memo.get(token)
        if kept is None:
            kept = memo[token] = fn(ctx)
        return kept

    return once


class _Variable:
    """A map or a geo as ``compile_key`` sees it (``gateway.http.keys.UserVariable``)."""

    def __init__(self, build: Callable[[int], KeyFn], longest: Callable[[], int | None], cached: bool) -> None:
        self._build = build
        self._longest = longest
        self._cached = cached
        self._fns: dict[int, KeyFn] = {}
        self._bound: list[int | None] = []

    @property
    def longest(self) -> int | None:
        if not self._bound:
            self._bound.append(self._longest())
        return self._bound[0]

    def key_fn(self, ipv6_prefix: int) -> KeyFn:
        fn = self._fns.get(ipv6_prefix)
        if fn is None:
            fn = self._build(ipv6_prefix)
            if self._cached:
                fn = _cached(fn)
            self._fns[ipv6_prefix] = fn
        return fn


class Variables(Mapping[str, _Variable]):
    """The maps and geo of one configuration, by name, compiled on first use (per ipv6_prefix)."""

    def __init__(self, maps: Mapping[str, MapSpec], geo: Mapping[str, GeoSpec], uses: Mapping[str, int]) -> None:
        self._maps = maps
        self._geo = geo
        self._vars: dict[str, _Variable] = {}
        for name in maps:
            self._vars[name] = _Variable(
                partial(self._map_fn, name), partial(self._map_longest, name), uses.get(name, 0) > 1
            )
        for name, spec in geo.items():
            self._vars[name] = _Variable(partial(_geo_fn, spec), partial(_geo_longest, spec), uses.get(name, 0) > 1)

    def __getitem__(self, name: str) -> _Variable:
        return self._vars[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._vars)

    def __len__(self) -> int:
        return len(self._vars)

    def _map_longest(self, name: str) -> int | None:
        spec = self._maps[name]
        bounds = [longest_key(spec.default, self)]
        for entry in spec.entries:
            captures = entry.kind in ("regex", "iregex") and _capture_names(entry.value, entry.key)
            bounds.append(None if captures else longest_key(entry.value, self))
        if any(bound is None for bound in bounds):
            return None
        return max(bound for bound in bounds if bound is not None)

    def _map_fn(self, name: str, ipv6_prefix: int) -> KeyFn:
        """The map compiled: its table, and its values with the client address masked to ``ipv6_prefix``."""
        spec = self._maps[name]
        exact: dict[bytes, MapValue] = {}
        heads: dict[bytes, MapValue] = {}
        tails: dict[bytes, MapValue] = {}
        regexes: list[tuple[re.Pattern[bytes], RegexValue]] = []
        for entry in spec.entries:
            key = entry.key.encode("utf-8", "surrogateescape")
            if entry.kind in ("regex", "iregex"):
                pattern = re.compile(key, re.IGNORECASE if entry.kind == "iregex" else 0)
                regexes.append((pattern, self._regex_value(entry.value, ipv6_prefix, pattern)))
                continue
            value = self._value(entry.value, ipv6_prefix)
            if entry.kind == "exact":
                exact[key.lower()] = value
            elif entry.kind == "head":
                suffix = key.lower()[2:] if key.startswith(b"*.") else key.lower()[1:]
                heads[suffix] = value
                if key.startswith(b"."):  # .example.com is example.com too
                    exact.setdefault(suffix, value)
            else:
                tails[key.lower()[:-2]] = value
        table = MapTable(
            exact=exact,
            default=self._value(spec.default, ipv6_prefix),
            hostnames=spec.hostnames,
            heads=heads,
            tails=tails,
            regexes=regexes,
        )
        return table.lookup_fn(compile_text(spec.source, variables=self))

    def _value(self, template: KeyTemplate, ipv6_prefix: int) -> MapValue:
        if not template.variables:
            return template.source.encode("utf-8", "surrogateescape")
        return compile_text(template, ipv6_prefix=ipv6_prefix, variables=self)

    def _regex_value(self, template: KeyTemplate, ipv6_prefix: int, pattern: re.Pattern[bytes]) -> RegexValue:
        captures = _capture_names(template, pattern.pattern.decode("utf-8", "surrogateescape"))
        if not captures:
            value = self._value(template, ipv6_prefix)
            return value if isinstance(value, bytes) else partial(_of_request, value)
        parts: list[CaptureFn] = []
        for kind, text in template.parts:
            if kind == "lit":
                parts.append(partial(_constant, text.encode("utf-8", "surrogateescape")))
            elif text in captures:
                parts.append(_capture(text, pattern))
            else:
                one = KeyTemplate(source="$" + text, parts=(("var", text),))
                parts.append(partial(_of_request, compile_text(one, ipv6_prefix=ipv6_prefix, variables=self)))
        frozen = tuple(parts)
        return lambda ctx, match: b"".join([part(ctx, match) for part in frozen])


def _constant(data: bytes, ctx: RequestContext, match: Match) -> bytes:
    return data


def _of_request(fn: KeyFn, ctx: RequestContext, match: Match) -> bytes:
    return fn(ctx)


def _geo_longest(spec: GeoSpec) -> int:
    return max([len(spec.default.encode())] + [len(e.value.encode()) for e in spec.entries])


def _geo_fn(spec: GeoSpec, ipv6_prefix: int) -> KeyFn:
    """The geo compiled (its values are text: ``ipv6_prefix`` changes nothing)."""
    default = spec.default.encode("utf-8", "surrogateescape")
    if spec.ranges:
        painted = paint_ranges((e.first, e.last, e.value, e.target) for e in spec.entries)
        table = GeoTable(default, ranges=[(s, e, v.encode("utf-8", "surrogateescape")) for s, e, v in painted])
    else:
        networks = [(e.version, e.prefixlen, e.first, e.value.encode("utf-8", "surrogateescape")) for e in spec.entries]
        table = GeoTable(default, networks=networks)
    source = spec.source
    if source is None or source.parts == (("var", "remote_addr"),):
        return table.lookup_fn(None)
    return table.lookup_fn(compile_text(source))


def paint_ranges(entries: Iterable[tuple[int, int, str, str]]) -> list[tuple[int, int, str]]:
    """Ranges ``(first, last, value, as written)`` laid out as nginx does: disjoint ``(first, last,
    value)``, sorted. A range inside an earlier one takes that part of it; one that overlaps
    another partly is a ValueError."""
    starts: list[int] = []
    spans: list[tuple[int, int, str]] = []
    for s, e, value, target in entries:
        i = bisect.bisect_right(starts, s) - 1  # the span that starts at or before s
        if i >= 0 and spans[i][1] >= s:
            first, last, old = spans[i]
            if e > last:
                raise ValueError(f'range "{target}" overlaps "{_dotted(first)}-{_dotted(last)}"')
            pieces = [(first, s - 1, old)] if first < s else []
            pieces.append((s, e, value))
            if e < last:
                pieces.append((e + 1, last, old))
            spans[i : i + 1] = pieces
            starts[i : i + 1] = [piece[0] for piece in pieces]
            continue
        if i + 1 < len(spans) and spans[i + 1][0] <= e:
            first, last, _ = spans[i + 1]
            raise ValueError(f'range "{target}" overlaps "{_dotted(first)}-{_dotted(last)}"')
        spans.insert(i + 1, (s, e, value))
        starts.insert(i + 1, s)
    return spans


def _dotted(value: int) -> str:
    return socket.inet_ntop(socket.AF_INET, value.to_bytes(4, "big"))


def _capture_names(template: KeyTemplate, pattern: str) -> set[str]:
    """The variables of ``template`` that are captures of ``pattern``: $1..$9 and its named groups."""
    names = set(re.compile(pattern.encode("utf-8", "surrogateescape")).groupindex) | {str(i) for i in range(1, 10)}
    return {name for name in template.variables if name in names}


def _capture(name: str, pattern: re.Pattern[bytes]) -> CaptureFn:
    if name.isdigit():
        group: int | str = int(name)
        if int(name) > pattern.groups:
            return lambda ctx, match: b""
    else:
        group = name

    def capture(ctx: RequestContext, match: Match) -> bytes:
        return match.group(group) or b""

    return capture
