"""``access:``: the client addresses allowed and denied before any route, inline or from
blocklist-format files read at each (re)load.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from gateway.config.reader import Reader, as_str
from gateway.config.realip import parse_networks
from gateway.errors import KeyPath
from gateway.http.realip import Network


@dataclass(frozen=True, slots=True, kw_only=True)
class AccessSpec:
    allow: tuple[Network, ...] = ()
    deny: tuple[Network, ...] = ()
    allow_file: str | None = None  # a blocklist-format file, read at each (re)load
    deny_file: str | None = None
    allow_from_file: tuple[str, ...] = ()  # its canonical CIDRs
    deny_from_file: tuple[str, ...] = ()


def parse_access(r: Reader, value: Any, path: KeyPath) -> AccessSpec:
    data = r.mapping(value, path, ("allow", "deny", "allow_file", "deny_file"))
    if data is None:
        return AccessSpec()
    allow_file = r.field(data, "allow_file", path, as_str, None)
    deny_file = r.field(data, "deny_file", path, as_str, None)
    return AccessSpec(
        allow=parse_networks(r, data["allow"], path + ("allow",)) if "allow" in data else (),
        deny=parse_networks(r, data["deny"], path + ("deny",)) if "deny" in data else (),
        allow_file=allow_file,
        deny_file=deny_file,
        allow_from_file=_network_file(r, allow_file, path + ("allow_file",)) if allow_file else (),
        deny_from_file=_network_file(r, deny_file, path + ("deny_file",)) if deny_file else (),
    )


def _network_file(r: Reader, name: str, path: KeyPath) -> tuple[str, ...]:
    """The CIDRs of a blocklist-format file (relative to the configuration file); errors name file:line."""
    from gateway.bans.blocklist import MAX_ERRORS_SHOWN, read_blocklist

    if not os.path.isabs(name) and r.doc.file and not r.doc.file.startswith("<"):
        name = os.path.join(os.path.dirname(os.path.abspath(r.doc.file)), name)
    try:
        found = read_blocklist(name)
    except OSError as exc:
        r.error(path, f"cannot read {name}: {exc.strerror or exc}")
        return ()
    for number, problem in found.errors[:MAX_ERRORS_SHOWN]:
        r.error(path, f"{name}:{number}: {problem}")
    if len(found.errors) > MAX_ERRORS_SHOWN:
        r.error(path, f"{name}: {len(found.errors) - MAX_ERRORS_SHOWN} more lines are not addresses")
    return tuple(target for _, target in found.targets)
