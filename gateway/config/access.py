"""``access:``: who may enter, in two forms.

* nginx's ``allow``/``deny`` list, ``access: [{allow: 10.0.0.0/8}, {deny: all}]``, at the top
  level (nginx's http level), in a server and in a route. The first rule that matches
  decides; a level with a list of its own does not inherit the outer one, a level without
  one inherits it whole (``parse_access_rules``; compiled by ``gateway.http.access``). It is
  checked where nginx's access phase is: after the guard ``rules:`` and ``return``, after the limits.
* the gateway's own mapping, ``access: {allow: [...], deny: [...], allow_file:, deny_file:}``:
  ``deny`` answers 403 before any route is chosen, ``allow`` is never limited nor banned,
  inline or from blocklist-format files read at each (re)load. Its ``rules:`` key holds the
  top-level nginx list beside them (``access: [...]`` is short for ``access: {rules: [...]}``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from gateway.config.reader import Reader, as_str, network
from gateway.config.realip import parse_networks
from gateway.errors import KeyPath
from gateway.http.access import AccessRule
from gateway.http.realip import Network

RULE_ACTIONS = ("allow", "deny")


@dataclass(frozen=True, slots=True, kw_only=True)
class AccessSpec:
    allow: tuple[Network, ...] = ()
    deny: tuple[Network, ...] = ()
    allow_file: str | None = None  # a blocklist-format file, read at each (re)load
    deny_file: str | None = None
    allow_from_file: tuple[str, ...] = ()  # its canonical CIDRs
    deny_from_file: tuple[str, ...] = ()
    rules: tuple[AccessRule, ...] | None = None  # nginx's http-level allow/deny list (None: none)


def parse_access(r: Reader, value: Any, path: KeyPath) -> AccessSpec:
    if isinstance(value, list):
        return AccessSpec(rules=parse_access_rules(r, value, path))
    data = r.mapping(value, path, ("allow", "deny", "allow_file", "deny_file", "rules"))
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
        rules=parse_access_rules(r, data["rules"], path + ("rules",)) if "rules" in data else None,
    )


def parse_access_rules(r: Reader, value: Any, path: KeyPath) -> tuple[AccessRule, ...]:
    """``[{allow: 10.0.0.0/8}, {deny: [192.0.2.1, 2001:db8::/32]}, {deny: all}]``, in order."""
    if not isinstance(value, list):
        r.error(path, "expected a list of rules in nginx's order, such as [{allow: 10.0.0.0/8}, {deny: all}]")
        return ()
    out: list[AccessRule] = []
    for i, item in enumerate(value):
        at = path + (i,)
        data = r.mapping(item, at, RULE_ACTIONS)
        if data is None or any(key not in RULE_ACTIONS for key in data):
            continue
        if len(data) != 1:
            r.error(at, "one rule per entry: {allow: ...} or {deny: ...}")
            continue
        action, targets = next(iter(data.items()))
        where = at + (action,)
        items = targets if isinstance(targets, list) else [targets]
        if not items:
            r.error(where, "expected an address, a CIDR or all")
        for j, target in enumerate(items):
            try:
                out.append(AccessRule(action == "allow", _rule_network(target)))
            except ValueError as exc:
                r.error(where + (j,) if isinstance(targets, list) else where, str(exc))
    return tuple(out)


def _rule_network(value: Any) -> Network | None:
    if value == "all":
        return None
    if isinstance(value, str) and value.startswith("unix:"):
        raise ValueError("unix: peers never reach the gateway (it listens on TCP only)")
    if not isinstance(value, str):
        raise ValueError(f"expected an address, a CIDR or all, got {value!r}")
    return network(value)


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
