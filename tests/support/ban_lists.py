"""Large, realistic ban lists for the scale tests: mixed IPv4 /32, /24, /16 and IPv6 /128, /64."""

from __future__ import annotations

import random
import socket

# share of each kind, in order: (version, prefix length, weight)
KINDS = ((4, 32, 40), (4, 24, 20), (4, 16, 5), (6, 128, 20), (6, 64, 15))
FREE_V4 = "192.0.2.1"  # TEST-NET-1: never in a generated list
FREE_V6 = "2001:db9::1"  # outside 2001:db8::/32, where the IPv6 entries are drawn


def _v4(rng: random.Random) -> int:
    while True:
        first = rng.randint(11, 223)
        if first not in (127, 192):  # loopback (the test client) and 192.0.0.0/8 (FREE_V4) stay clear
            return (first << 24) | rng.getrandbits(24)


def _v6(rng: random.Random) -> int:
    return (0x20010DB8 << 96) | rng.getrandbits(96)


def mixed_blocklist(count: int, seed: int = 13) -> list[str]:
    """``count`` distinct canonical CIDRs, in the proportions of ``KINDS``."""
    rng = random.Random(seed)
    out: dict[str, None] = {}
    total = sum(w for _, _, w in KINDS)
    for version, plen, weight in KINDS:
        wanted = count * weight // total if (version, plen) != KINDS[-1][:2] else count - len(out)
        bits = 32 if version == 4 else 128
        mask = ((1 << bits) - 1) ^ ((1 << (bits - plen)) - 1)
        goal = len(out) + wanted
        while len(out) < goal:
            value = (_v4(rng) if version == 4 else _v6(rng)) & mask
            family = socket.AF_INET if version == 4 else socket.AF_INET6
            out[f"{socket.inet_ntop(family, value.to_bytes(bits // 8, 'big'))}/{plen}"] = None
    return list(out)


def address_inside(target: str) -> str:
    """One address covered by ``target`` (not its network address when there is room)."""
    addr, plen_text = target.split("/")
    plen = int(plen_text)
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    bits = 128 if family == socket.AF_INET6 else 32
    value = int.from_bytes(socket.inet_pton(family, addr), "big")
    if plen < bits:
        value |= 0x1234 & ((1 << (bits - plen)) - 1) or 1
    return socket.inet_ntop(family, value.to_bytes(bits // 8, "big"))


def samples(targets: list[str], per_kind: int = 8) -> list[str]:
    """A few addresses inside the list, from every kind of entry."""
    picked: list[str] = []
    for version, plen, _ in KINDS:
        suffix = f"/{plen}"
        of_kind = [t for t in targets if t.endswith(suffix) and (":" in t) == (version == 6)]
        step = max(1, len(of_kind) // per_kind)
        picked += [address_inside(t) for t in of_kind[::step][:per_kind]]
    return picked
