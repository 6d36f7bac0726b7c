"""``maps:`` and ``geo:``: variables the configuration defines, as nginx's ``map`` and ``geo``.

    maps:
      limit_key:                    # defines $limit_key
        source: $limited            # variables and text: "$request_method:$uri"
        default: ""                 # when nothing matches ("" when absent)
        hostnames: false            # keys *.example.com, .example.com, www.example.*
        values:                     # exact keys; "~re" and "~*re" regexes, tried in order
          "0": ""
          "1": $binary_remote_addr
    geo:
      limited:                      # defines $limited
        source: $remote_addr        # the address looked up (default: the client, after real_ip)
        default: "1"
        ranges: false               # true: keys are ranges, 10.0.0.1-10.0.0.255
        values:
          10.0.0.0/8: "0"

A map's values (and default) may hold variables, the named and numbered captures of their
regex included; a geo's values are plain text, as in nginx. Names share one namespace with
nginx's own variables: a map cannot redefine ``$host``. Maps may use other maps and geo, but
not in a cycle. Everything is checked here and reported with its file, line and key; the
lookup structures are built once per load in ``gateway.http.maps``.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gateway.config.reader import Reader, as_bool
from gateway.errors import KeyPath
from gateway.http.keys import ADDRESS_VARIABLES, Defined, KeyTemplate, is_variable_name, parse_key
from gateway.http.maps import paint_ranges
from gateway.http.pcre import compile_pcre_bytes
from gateway.http.templates import builtin_text_variable

MapKind = Literal["exact", "head", "tail", "regex", "iregex"]
_NAME = re.compile(r"\$?([A-Za-z0-9_]+)")
_RESERVED = ("limit_req_status", "limit_conn_status", "limit_count_status", "status", "request", "request_id")
_BITS = {4: 32, 6: 128}
_FAMILY = {4: socket.AF_INET, 6: socket.AF_INET6}


@dataclass(frozen=True, slots=True, kw_only=True)
class MapEntrySpec:
    """One line of a map: its key (without ``~``/``~*``, a pattern in Python's spelling for a
    regex), how it matches, and its value."""

    key: str
    kind: MapKind
    value: KeyTemplate


@dataclass(frozen=True, slots=True, kw_only=True)
class MapSpec:
    name: str
    source: KeyTemplate
    hostnames: bool
    entries: tuple[MapEntrySpec, ...]  # in the order written
    default: KeyTemplate


@dataclass(frozen=True, slots=True, kw_only=True)
class GeoEntrySpec:
    """A network (``10.0.0.0/8``) or, with ``ranges``, an IPv4 range: the addresses
    ``first``..``last`` as integers."""

    target: str  # as written
    version: int
    first: int
    last: int
    prefixlen: int  # the network's prefix length (ranges: -1)
    value: str


@dataclass(frozen=True, slots=True, kw_only=True)
class GeoSpec:
    name: str
    source: KeyTemplate | None  # None: the client address after real_ip ($remote_addr)
    ranges: bool
    default: str
    entries: tuple[GeoEntrySpec, ...]


@dataclass(frozen=True, slots=True)
class VariablesSpec:
    maps: Mapping[str, MapSpec]
    geo: Mapping[str, GeoSpec]
    defined: Defined


def _text(value: Any) -> str:
    """A value as written: text, or a whole number; anything else needs quotes."""
    if value is None:
        raise ValueError('expected a text; write "" for an empty value')
    if isinstance(value, (bool, float, list, dict)):
        shown = str(value).lower() if isinstance(value, bool) else str(value)
        raise ValueError(f"expected a text: quote {shown!r} (YAML reads it as a {type(value).__name__})")
    return str(value)


def _template(value: Any, defined: Defined, captures: frozenset[str] = frozenset()) -> KeyTemplate:
    """A map value: text with variables, possibly empty (an empty key is not counted)."""
    text = _text(value)
    if not text:
        return KeyTemplate(source="", parts=())
    if captures:
        defined = Defined(names=defined.names | captures)
    return parse_key(text, defined)


def _variable_name(r: Reader, name: str, path: KeyPath) -> str | None:
    match = _NAME.fullmatch(name)
    if match is None:
        r.error(path, f"invalid variable name {name!r}: letters, digits and _", at_key=True)
        return None
    bare = match.group(1)
    if is_variable_name(bare) or builtin_text_variable(bare) or bare in _RESERVED or bare.isdigit():
        r.error(path, f'"${bare}" is a variable of nginx\'s own: choose another name', at_key=True)
        return None
    return bare


def parse_variables(r: Reader, data: dict[str, Any]) -> VariablesSpec:
    """The ``maps:`` and ``geo:`` sections; the names they define, for every later template."""
    maps_raw = data.get("maps")
    geo_raw = data.get("geo")
    declared: dict[str, tuple[str, str]] = {}  # name -> (section, key as written)
    for section, raw in (("maps", maps_raw), ("geo", geo_raw)):
        if raw is None and section not in data:
            continue
        if not isinstance(raw, dict):
            r.error((section,), f"expected a mapping of variable names to {section} definitions")
            continue
        for key in raw:
            name = _variable_name(r, str(key), (section, key))
            if name is None:
                continue
            if name in declared:
                r.error((section, key), f'"${name}" is defined twice (also in {declared[name][0]})', at_key=True)
                continue
            declared[name] = (section, str(key))
    defined = Defined(names=frozenset(declared))
    maps: dict[str, MapSpec] = {}
    geo: dict[str, GeoSpec] = {}
    for name, (section, key) in declared.items():
        body = (maps_raw if section == "maps" else geo_raw)[key]  # type: ignore[index]
        if section == "maps":
            spec = _map(r, name, body, ("maps", key), defined)
            if spec is not None:
                maps[name] = spec
        else:
            geo_spec = _geo(r, name, body, ("geo", key), defined)
            if geo_spec is not None:
                geo[name] = geo_spec
    _check_cycles(r, maps, declared)
    binary, addressed = _closures(maps)
    return VariablesSpec(
        maps=maps, geo=geo, defined=Defined(names=frozenset(declared), binary=binary, addressed=addressed)
    )


def _map(r: Reader, name: str, body: Any, path: KeyPath, defined: Defined) -> MapSpec | None:
    data = r.mapping(body, path, ("source", "values", "default", "hostnames"), required=("source",))
    if data is None:
        return None
    source = r.field(data, "source", path, lambda v: parse_key(v, defined))
    hostnames = r.field(data, "hostnames", path, as_bool, False)
    default = r.field(data, "default", path, lambda v: _template(v, defined), KeyTemplate(source="", parts=()))
    entries: list[MapEntrySpec] = []
    values = data.get("values", {})
    if values is None:
        values = {}
    if not isinstance(values, dict):
        r.error(path + ("values",), 'expected a mapping of keys to values, such as {"1": $binary_remote_addr}')
        values = {}
    seen: dict[str, str] = {}
    for raw_key, raw_value in values.items():
        epath = path + ("values", raw_key)
        try:
            entry = _entry(str(raw_key), raw_value, bool(hostnames), defined)
        except ValueError as exc:
            r.error(epath, str(exc))
            continue
        if entry.kind in ("exact", "head", "tail"):
            # nginx compares lower-cased keys: "POST" and "post" are the same key
            folded = f"{entry.kind}:{entry.key.lower()}"
            if folded in seen:
                r.error(
                    epath, f'duplicate key "{raw_key}" (the same as "{seen[folded]}": keys ignore case)', at_key=True
                )
                continue
            seen[folded] = str(raw_key)
        entries.append(entry)
    if source is None or hostnames is None or default is None:
        return None
    return MapSpec(name=name, source=source, hostnames=hostnames, entries=tuple(entries), default=default)


def _entry(key: str, value: Any, hostnames: bool, defined: Defined) -> MapEntrySpec:
    if key.startswith("~"):
        insensitive = key.startswith("~*")
        source = key[2:] if insensitive else key[1:]
        if not source:
            raise ValueError("an empty regex")
        pattern, compiled = compile_pcre_bytes(source, icase=insensitive)
        captures = frozenset(str(n) for n in compiled.groupindex) | frozenset(str(i) for i in range(1, 10))
        return MapEntrySpec(
            key=pattern, kind="iregex" if insensitive else "regex", value=_template(value, defined, captures)
        )
    if key.startswith("\\"):  # nginx: \~x, \default: a key that would otherwise be special
        key = key[1:]
        return MapEntrySpec(key=key, kind="exact", value=_template(value, defined))
    if key == "default":
        raise ValueError('write default: beside values: (or "\\default" for a key that is the word)')
    kind: MapKind = "exact"
    if hostnames and ("*" in key or key.startswith(".")):
        kind = _wildcard(key)
    return MapEntrySpec(key=key, kind=kind, value=_template(value, defined))


def _wildcard(key: str) -> MapKind:
    """nginx's wildcard names: ``*.example.com`` and ``.example.com`` (head), ``www.example.*`` (tail)."""
    if key.startswith("*.") and "*" not in key[2:] and len(key) > 2:
        return "head"
    if key.startswith(".") and "*" not in key and len(key) > 1:
        return "head"
    if key.endswith(".*") and "*" not in key[:-2] and len(key) > 2:
        return "tail"
    raise ValueError(f"invalid wildcard {key!r}: *.example.com, .example.com or www.example.*")


def _geo(r: Reader, name: str, body: Any, path: KeyPath, defined: Defined) -> GeoSpec | None:
    data = r.mapping(body, path, ("source", "values", "default", "ranges"))
    if data is None:
        return None
    source = r.field(data, "source", path, lambda v: parse_key(v, defined), None)
    ranges = r.field(data, "ranges", path, as_bool, False)
    default = r.field(data, "default", path, _geo_value, "")
    values = data.get("values", {})
    if values is None:
        values = {}
    if not isinstance(values, dict):
        r.error(path + ("values",), 'expected a mapping of networks to values, such as {10.0.0.0/8: "0"}')
        values = {}
    entries: list[GeoEntrySpec] = []
    for raw_key, raw_value in values.items():
        epath = path + ("values", raw_key)
        try:
            value = _geo_value(raw_value)
            entry = _range(str(raw_key), value) if ranges else _network(str(raw_key), value)
        except ValueError as exc:
            r.error(epath, str(exc))
            continue
        entries.append(entry)
    if ranges:
        try:
            paint_ranges((e.first, e.last, e.value, e.target) for e in entries)
        except ValueError as exc:
            r.error(path + ("values",), str(exc))
            return None
    else:
        seen: dict[tuple[int, int, int], str] = {}
        for entry in entries:
            net = (entry.version, entry.prefixlen, entry.first)
            if net in seen:
                r.warn(
                    path + ("values", entry.target),
                    f'duplicate network "{entry.target}" (also "{seen[net]}"): the last wins',
                )
            seen[net] = entry.target
    if default is None or ranges is None:
        return None
    return GeoSpec(name=name, source=source, ranges=ranges, default=default, entries=tuple(entries))


def _geo_value(value: Any) -> str:
    text = _text(value)
    if "$" in text:
        raise ValueError("a geo value is plain text, as in nginx (use a map for variables)")
    return text


def _address(text: str) -> tuple[int, int]:
    """``"10.1.2.3"`` -> (4, int); ValueError for anything else."""
    version = 6 if ":" in text else 4
    try:
        raw = socket.inet_pton(_FAMILY[version], text)
    except OSError:
        raise ValueError(f"not an IP address: {text!r}") from None
    value = int.from_bytes(raw, "big")
    if version == 6 and value >> 32 == 0xFFFF:  # ::ffff:a.b.c.d is the IPv4 address, as for clients
        return 4, value & 0xFFFFFFFF
    return version, value


def _network(target: str, value: str) -> GeoEntrySpec:
    text = target.strip()
    addr, slash, plen_text = text.partition("/")
    version, number = _address(addr)
    bits = _BITS[version]
    mapped = version == 4 and ":" in addr
    if not slash:
        plen = bits
    elif plen_text.isdigit() and plen_text.isascii() and int(plen_text) <= (128 if mapped else bits):
        plen = int(plen_text) - (96 if mapped else 0)
        if plen < 0:
            raise ValueError(f"invalid network {target!r}: an IPv4-mapped prefix is at least /96")
    else:
        raise ValueError(f"invalid network {target!r}: an address or a CIDR such as 10.0.0.0/8")
    host_bits = bits - plen
    first = number >> host_bits << host_bits
    return GeoEntrySpec(
        target=target, version=version, first=first, last=first | ((1 << host_bits) - 1), prefixlen=plen, value=value
    )


def _range(target: str, value: str) -> GeoEntrySpec:
    low, dash, high = target.strip().partition("-")
    if not dash:
        raise ValueError(f"invalid range {target!r}: with ranges: true, keys are a.b.c.d-e.f.g.h")
    try:
        v1, first = _address(low.strip())
        v2, last = _address(high.strip())
    except ValueError:
        raise ValueError(f"invalid range {target!r}: IPv4 addresses a.b.c.d-e.f.g.h") from None
    if v1 != 4 or v2 != 4:
        raise ValueError(f"invalid range {target!r}: ranges are IPv4 only, as in nginx")
    if first > last:
        raise ValueError(f"invalid range {target!r}: the first address is after the last")
    return GeoEntrySpec(target=target, version=4, first=first, last=last, prefixlen=-1, value=value)


def _references(spec: MapSpec) -> set[str]:
    names = set(spec.source.variables) | set(spec.default.variables)
    for entry in spec.entries:
        names.update(entry.value.variables)
    return names


def _check_cycles(r: Reader, maps: Mapping[str, MapSpec], declared: Mapping[str, tuple[str, str]]) -> None:
    """A map that needs itself, directly or through others, is an error (nginx finds it per request)."""
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for other in sorted(_references(maps[name])):
            if other not in maps:
                continue
            if state.get(other) == 1:
                cycle = trail[trail.index(other) :] + [other] if other in trail else [name, other]
                section, key = declared[other]
                r.error((section, key), "a cycle of maps: " + " -> ".join("$" + n for n in cycle), at_key=True)
            elif other not in state:
                visit(other, trail + [other])
        state[name] = 2

    for name in maps:
        if name not in state:
            visit(name, [name])


def _closures(maps: Mapping[str, MapSpec]) -> tuple[frozenset[str], frozenset[str]]:
    """The maps whose value can hold raw address bytes, and those whose value can hold the client's
    address (through other maps too)."""
    binary: set[str] = set()
    addressed: set[str] = set()
    changed = True
    while changed:  # a few rounds at most: as many as maps nest
        changed = False
        for name, spec in maps.items():
            used: set[str] = set(spec.default.variables)
            for entry in spec.entries:
                used.update(entry.value.variables)
            if name not in binary and ("binary_remote_addr" in used or used & binary):
                binary.add(name)
                changed = True
            if name not in addressed and (used & set(ADDRESS_VARIABLES) or used & addressed):
                addressed.add(name)
                changed = True
    return frozenset(binary), frozenset(addressed)
