"""nginx's ``allow``/``deny`` list (ngx_http_access_module), compiled once into a lookup.

The rules are read in the order written and the first that matches decides: ``allow``
lets the request go on, ``deny`` answers 403; when none matches the request goes on.
``all`` matches every address. The compiled form never walks the rules: per address
family it keeps one dict per prefix length (network -> the index of the first rule with
that network), so a lookup costs one dict probe per distinct prefix length, and the
smallest index found is the rule nginx would have stopped at. The rules after an
``all`` are never reached and are dropped; when every rule left has the same action the
first probe that hits decides.

Client addresses come parsed (``gateway.http.realip``): an IPv4-mapped IPv6 address
(``::ffff:a.b.c.d``) is already its IPv4 address, so it meets the IPv4 rules as in nginx,
and a rule written as ``::ffff:a.b.c.d/N`` (N >= 96) is compiled as the IPv4 rule it means.
One case differs (the parsed address no longer says it came mapped): nginx reads the IPv6
rules for a mapped client when the list has no IPv4 rule and no ``all``; here it matches none.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from gateway.http.realip import ClientAddr, Network

_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


@dataclass(frozen=True, slots=True)
class AccessRule:
    """One ``allow``/``deny``: its network, or None for ``all``."""

    allow: bool
    network: Network | None

    def __str__(self) -> str:
        return f"{'allow' if self.allow else 'deny'} {self.network if self.network is not None else 'all'}"


def _unmapped(net: Network) -> Network:
    if isinstance(net, ipaddress.IPv6Network) and net.prefixlen >= 96 and net.subnet_of(_MAPPED):
        v4 = ipaddress.IPv4Address(int(net.network_address) & 0xFFFFFFFF)
        return ipaddress.IPv4Network((v4, net.prefixlen - 96))
    return net


def _mask(version: int, prefixlen: int) -> int:
    bits = 32 if version == 4 else 128
    return ((1 << bits) - 1) ^ ((1 << (bits - prefixlen)) - 1)


class AccessRules:
    """A compiled first-match list: ``allows(client)`` is nginx's decision for that address."""

    __slots__ = ("_actions", "_default", "_tables", "_uniform", "rules")

    def __init__(self, rules: Iterable[AccessRule]) -> None:
        self.rules: tuple[AccessRule, ...] = tuple(rules)
        kept: list[AccessRule] = []
        default = True  # no rule matches: the request goes on
        for rule in self.rules:
            if rule.network is None:
                default = rule.allow
                break
            kept.append(rule)
        self._default = default
        # index -> its action; the index len(kept) stands for "no rule matched"
        self._actions = tuple(r.allow for r in kept) + (default,)
        by_len: dict[tuple[int, int], dict[int, int]] = {}
        for i, rule in enumerate(kept):
            assert rule.network is not None
            net = _unmapped(rule.network)
            nets = by_len.setdefault((net.version, net.prefixlen), {})
            nets.setdefault(int(net.network_address), i)  # a repeated network: its first rule decides
        self._tables = {
            version: tuple(
                (_mask(version, plen), by_len[(version, plen)])
                for plen in sorted((p for v, p in by_len if v == version), reverse=True)
            )
            for version in (4, 6)
        }
        # every reachable rule says the same (a blocklist, an allowlist): the first hit decides
        self._uniform = len({r.allow for r in kept}) <= 1

    def allows(self, client: ClientAddr) -> bool:
        value = client.value
        tables = self._tables.get(client.version, ())
        if self._uniform:
            for mask, nets in tables:
                if value & mask in nets:
                    return self._actions[0]
            return self._default
        best = len(self._actions) - 1
        for mask, nets in tables:
            i = nets.get(value & mask)
            if i is not None and i < best:
                best = i
        return self._actions[best]

    def __str__(self) -> str:
        return "; ".join(str(r) for r in self.rules)
