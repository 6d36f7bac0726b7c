"""nginx's ``map`` and ``geo`` blocks (http level) to the gateway's ``maps:`` and ``geo:``.

They are read before anything else of the http level, as nginx knows every variable before it
compiles a zone key or a header value: what follows is then checked with their names
(``Result.defined``). Each block becomes one entry, checked by the gateway's own parser
(``gateway.config.maps``); one it refuses (a variable the gateway does not know, such as
``$sent_http_content_type``) is skipped with the reason, and so is everything that uses it.

* ``map``: ``default``, ``hostnames``, exact keys, ``~``/``~*`` regexes (their captures usable
  in values), values with variables, several variables as the source; ``volatile`` changes
  nothing here (a value is computed per request, at most once);
* ``geo``: ``default``, networks, ``ranges`` (a network in a ranges geo is its range), and
  ``delete`` of a network listed before. ``proxy``/``proxy_recursive`` (the address from
  X-Forwarded-For when the peer is a listed proxy) have no equivalent: such a geo is skipped.

``include`` inside a block is spliced in by the parser. Only the maps and geo that something
written (a zone key, a header, a return, a rule, another map) uses are written; the others
need no key.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from gateway.config.maps import parse_variables
from gateway.config.reader import Reader
from gateway.config.source import Document
from gateway.nginxconf.parser import Directive
from gateway.nginxconf.result import Doc, Result

_NAME = re.compile(r"\$([A-Za-z0-9_]+)")
_USED = re.compile(r"\$(?:\{([A-Za-z0-9_]+)\}|([A-Za-z0-9_]+))")
_MAX_ROUNDS = 50  # skipping one block can make another fail (it used the first): a few rounds at most


class Variables:
    def __init__(self, result: Result) -> None:
        self.result = result
        self.maps: dict[str, Doc] = {}
        self.geo: dict[str, Doc] = {}
        self.where: dict[str, Directive] = {}  # variable name -> its block

    def read(self, block: list[Directive]) -> None:
        """Every map and geo of the http level, then the names they define, checked together."""
        for d in block:
            if d.name == "map":
                self._map(d)
            elif d.name == "geo":
                self._geo(d)
        self._check()

    def _target(self, d: Directive, arg: str) -> str | None:
        match = _NAME.fullmatch(arg)
        if match is None:
            self.result.skip(d, f'nginx: invalid variable name "{arg}"')
            return None
        name = match.group(1)
        if name in self.where:
            self.result.skip(d, f'"${name}" is defined twice (first at {self.where[name].where}): the first is kept')
            return None
        return name

    def _map(self, d: Directive) -> None:
        if len(d.args) != 2 or d.block is None:
            self.result.skip(d, 'nginx: invalid number of parameters in "map" (map SOURCE $name { ... })')
            return
        name = self._target(d, d.args[1])
        if name is None:
            return
        spec: Doc = {"source": d.args[0]}
        values: dict[str, str] = {}
        for x in d.block:
            if x.block is not None or len(x.args) > 1:
                self.result.skip(d, f"nginx: invalid map entry at {x.where}: KEY VALUE;")
                return
            if x.name == "hostnames" and not x.args:
                spec["hostnames"] = True
            elif x.name == "volatile" and not x.args:
                continue  # computed per request anyway (at most once): no key needed
            elif not x.args:
                self.result.skip(d, f'nginx: invalid map entry "{x.name}" at {x.where}: KEY VALUE;')
                return
            elif x.name == "default":
                spec["default"] = x.args[0]
            elif x.name.lower() in (k.lower() for k in values) and not x.name.startswith("~"):
                self.result.skip(d, f'nginx: conflicting parameter "{x.name}" at {x.where}')
                return
            else:
                values[x.name] = x.args[0]
        if values:
            spec["values"] = values
        self.maps[name] = spec
        self.where[name] = d

    def _geo(self, d: Directive) -> None:
        if len(d.args) not in (1, 2) or d.block is None:
            self.result.skip(d, 'nginx: invalid number of parameters in "geo" (geo [ADDRESS] $name { ... })')
            return
        name = self._target(d, d.args[-1])
        if name is None:
            return
        spec: Doc = {}
        if len(d.args) == 2:
            spec["source"] = d.args[0]
        ranges = any(x.name == "ranges" and not x.args for x in d.block)
        values: dict[str, str] = {}
        for x in d.block:
            if x.name == "ranges" and not x.args:
                spec["ranges"] = True
            elif x.name in ("proxy", "proxy_recursive"):
                self.result.skip(
                    d,
                    f"{x.name} ({x.where}) has no gateway equivalent (take the client address from "
                    "X-Forwarded-For with set_real_ip_from instead): this geo is not translated",
                )
                return
            elif x.block is not None or len(x.args) != 1:
                self.result.skip(d, f"nginx: invalid geo entry at {x.where}: NETWORK VALUE;")
                return
            elif x.name == "default":
                spec["default"] = x.args[0]
            elif x.name == "delete":
                if ranges:
                    self.result.skip(d, f"delete ({x.where}) in a ranges geo is not translated: this geo is skipped")
                    return
                for key in [k for k in values if _same_network(k, x.args[0])]:
                    del values[key]
            else:
                key = _as_range(x.name) if ranges and "-" not in x.name else x.name
                values[key] = x.args[0]
        if values:
            spec["values"] = values
        self.geo[name] = spec
        self.where[name] = d

    def _check(self) -> None:
        """The gateway's parser on the blocks kept; one it refuses is skipped, then the rest again."""
        for _ in range(_MAX_ROUNDS):
            if not self.maps and not self.geo:
                return
            reader = Reader(Document(file="nginx", data=None))
            spec = parse_variables(reader, {"maps": self.maps, "geo": self.geo})
            failed: dict[str, str] = {}
            for error in reader.errors:
                if len(error.path) >= 2 and str(error.path[1]) in self.where:
                    failed.setdefault(str(error.path[1]), _reason(error.path, error.message))
            if not failed:
                self.result.defined = spec.defined
                return
            for name, reason in failed.items():
                self.result.skip(self.where[name], reason)
                self.maps.pop(name, None)
                self.geo.pop(name, None)
                del self.where[name]
        self.maps, self.geo, self.where = {}, {}, {}

    def finish(self, doc: Doc, written: list[Any]) -> None:
        """The maps and geo that ``written`` (what the translation wrote), or another kept one, uses."""
        used: set[str] = set()
        todo = _names_in(written) & set(self.where)
        while todo:
            name = todo.pop()
            used.add(name)
            todo |= (_names_in(self.maps.get(name, self.geo.get(name))) & set(self.where)) - used
        for name, d in self.where.items():
            if name not in used:
                self.result.same_here(d)  # nothing written uses it: it needs no key
        maps = {n: s for n, s in self.maps.items() if n in used}
        geo = {n: s for n, s in self.geo.items() if n in used}
        rest = dict(doc)
        doc.clear()  # written first: they are read first
        if geo:
            doc["geo"] = geo
        if maps:
            doc["maps"] = maps
        doc.update(rest)


def _reason(path: tuple[Any, ...], message: str) -> str:
    where = ".".join(str(p) for p in path[2:])
    return f"not translated: {where + ': ' if where else ''}{message}"


def _names_in(value: Any) -> set[str]:
    """Every ``$name`` in the strings of a document (keys included: a map's source may be one)."""
    out: set[str] = set()
    if isinstance(value, str):
        out.update(m.group(1) or m.group(2) for m in _USED.finditer(value))
    elif isinstance(value, dict):
        for k, v in value.items():
            out |= _names_in(k) | _names_in(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            out |= _names_in(v)
    return out


def _network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        return None


def _same_network(a: str, b: str) -> bool:
    na, nb = _network(a), _network(b)
    return na is not None and na == nb


def _as_range(text: str) -> str:
    """A network in a ranges geo: its first-last range (nginx accepts both there)."""
    net = _network(text)
    if net is None or net.version != 4:
        return text  # the gateway's parser says why
    return f"{net.network_address}-{net.broadcast_address}"
