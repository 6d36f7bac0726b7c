"""Which manual bans need ``force``: the one check shared by the admin API and the CLI.

A typo such as ``0.0.0.0/0`` or ``10.0.0.0/8`` would lock out everyone (or every
client behind a proxy), so a ban wider than /16 (IPv4) or /48 (IPv6) is refused
unless forced, and so is one that touches an address or network the
configuration trusts: a proxy in ``real_ip.from`` (banning it would ban every
client behind it) or a client in ``access.allow`` (never banned, so the ban
would be partly dead or a mistake).

``BanPolicy`` indexes the trusted networks once, so checking each line of a
100,000-line blocklist against a long ``access.allow`` costs a few dict probes
and one binary search, not a pass over the allow list.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from gateway.bans.table import net_key
from gateway.http.realip import Network

if TYPE_CHECKING:
    from gateway.config.schema import ConfigSpec

WIDEST_PREFIX = {4: 16, 6: 48}


class _Index:
    """Networks of one label: by (version, prefix length, network int), and sorted starts."""

    def __init__(self, label: str, networks: tuple[Network, ...], more: tuple[str, ...] = ()) -> None:
        self.label = label
        self.exact: dict[tuple[int, int, int], str] = {}
        self.lengths: dict[int, list[int]] = {4: [], 6: []}
        self.starts: dict[int, list[tuple[int, int]]] = {4: [], 6: []}  # (network int, position in names)
        items: list[tuple[tuple[int, int, int], str]] = [
            ((int(n.version), n.prefixlen, int(n.network_address)), str(n)) for n in networks
        ]
        items += [(net_key(text), text) for text in more]
        self.names = [name for _, name in items]
        for position, (key, name) in enumerate(items):
            self.exact.setdefault(key, name)
            self.starts[key[0]].append((key[2], position))
        for version in (4, 6):
            self.lengths[version] = sorted({k[1] for k in self.exact if k[0] == version})
            self.starts[version].sort()

    def overlap(self, version: int, plen: int, net: int) -> str | None:
        bits = 32 if version == 4 else 128
        for length in self.lengths[version]:  # a trusted network that contains the ban
            if length > plen:
                break
            mask = ((1 << bits) - 1) ^ ((1 << (bits - length)) - 1)
            found = self.exact.get((version, length, net & mask))
            if found is not None:
                return found
        starts = self.starts[version]  # one that starts inside the ban
        last = net | ((1 << (bits - plen)) - 1)
        i = bisect.bisect_left(starts, (net, -1))
        if i < len(starts) and starts[i][0] <= last:
            return self.names[starts[i][1]]
        return None


class BanPolicy:
    def __init__(self, spec: ConfigSpec) -> None:
        access = spec.access
        self.indexes = (
            _Index("real_ip.from", spec.real_ip.trusted),
            _Index("access.allow", access.allow, access.allow_from_file),
        )

    def refusal(self, target: str) -> str | None:
        """Why banning ``target`` (a canonical CIDR) needs ``force``; None when it does not."""
        version, plen, net = net_key(target)
        widest = WIDEST_PREFIX[version]
        if plen < widest:
            return f"{target} is wider than /{widest}"
        for index in self.indexes:
            protected = index.overlap(version, plen, net)
            if protected is not None:
                return f"{target} covers {protected} in {index.label}"
        return None


def ban_refusal(target: str, spec: ConfigSpec) -> str | None:
    """Why banning ``target`` (a canonical CIDR) needs ``force``; None when it does not."""
    return BanPolicy(spec).refusal(target)
