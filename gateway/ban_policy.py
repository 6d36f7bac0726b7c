"""Which manual bans need ``force``: the one check shared by the admin API and the CLI.

A typo such as ``0.0.0.0/0`` or ``10.0.0.0/8`` would lock out everyone (or every
client behind a proxy), so a ban wider than /16 (IPv4) or /48 (IPv6) is refused
unless forced, and so is one that touches an address or network the
configuration trusts: a proxy in ``real_ip.from`` (banning it would ban every
client behind it) or a client in ``access.allow`` (never banned, so the ban
would be partly dead or a mistake).
"""

from __future__ import annotations

import ipaddress

from gateway.config.schema import ConfigSpec

WIDEST_PREFIX = {4: 16, 6: 48}


def ban_refusal(target: str, spec: ConfigSpec) -> str | None:
    """Why banning ``target`` (a canonical CIDR) needs ``force``; None when it does not."""
    net = ipaddress.ip_network(target, strict=False)
    widest = WIDEST_PREFIX[net.version]
    if net.prefixlen < widest:
        return f"{net} is wider than /{widest}"
    for label, networks in (("real_ip.from", spec.real_ip.trusted), ("access.allow", spec.access.allow)):
        for protected in networks:
            if protected.version == net.version and net.overlaps(protected):
                return f"{net} covers {protected} in {label}"
    return None
