"""The client's real address, with nginx's realip semantics.

Only a peer inside ``real_ip.from`` may replace its address with one taken from
``real_ip.header``. With ``recursive: false`` the last address in the header is
used; with ``recursive: true`` the header is walked from the right, skipping
trusted addresses, and the first untrusted one is used (or the leftmost, if all
are trusted). An entry that is not an address stops the walk, keeping the last
good one, as ``ngx_http_get_forwarded_addr`` does.

``real_ip.header: proxy_protocol`` takes the address from the connection's PROXY protocol
header instead (``listen ... proxy_protocol``), under the same trust rule.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from multidict import CIMultiDictProxy

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class ClientAddr:
    text: str  # canonical text form, e.g. "192.0.2.1" or "2001:db8::1"
    packed: bytes  # 4 or 16 bytes: nginx's $binary_remote_addr
    value: int
    version: int  # 4 or 6


UNKNOWN = ClientAddr(text="", packed=b"", value=0, version=0)


@lru_cache(maxsize=65536)
def parse_addr(text: str) -> ClientAddr | None:
    """Parse an address as found in a socket peer or a forwarding header (port allowed)."""
    s = text.strip()
    if not s:
        return None
    if s.startswith("["):
        end = s.find("]")
        if end < 0:
            return None
        s = s[1:end]
    elif s.count(":") == 1:
        s = s.split(":", 1)[0]
    if "%" in s:  # IPv6 zone id
        s = s.split("%", 1)[0]
    try:
        ip = ipaddress.ip_address(s)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ClientAddr(text=str(ip), packed=ip.packed, value=int(ip), version=ip.version)


class NetworkSet:
    """A set of CIDRs with a fast membership test on parsed addresses."""

    def __init__(self, networks: Iterable[Network]) -> None:
        self.networks: tuple[Network, ...] = tuple(networks)
        v4: dict[int, set[int]] = {}
        v6: dict[int, set[int]] = {}
        for net in self.networks:
            table = v4 if net.version == 4 else v6
            table.setdefault(net.prefixlen, set()).add(int(net.network_address))
        self._v4 = tuple((self._mask(4, plen), nets) for plen, nets in sorted(v4.items()))
        self._v6 = tuple((self._mask(6, plen), nets) for plen, nets in sorted(v6.items()))

    @staticmethod
    def _mask(version: int, prefixlen: int) -> int:
        bits = 32 if version == 4 else 128
        return ((1 << bits) - 1) ^ ((1 << (bits - prefixlen)) - 1)

    def __bool__(self) -> bool:
        return bool(self.networks)

    def __contains__(self, addr: ClientAddr) -> bool:
        tables = self._v4 if addr.version == 4 else self._v6
        value = addr.value
        for mask, nets in tables:
            if value & mask in nets:
                return True
        return False


class RealIp:
    def __init__(self, trusted: Sequence[Network], header: str, recursive: bool) -> None:
        self.trusted = NetworkSet(trusted)
        self.header = header
        self.recursive = recursive
        self.proxy_protocol = header.lower() == "proxy_protocol"

    def resolve_proxy(self, peer: ClientAddr, header: Any) -> ClientAddr:
        """With ``header: proxy_protocol``: the address a trusted peer's PROXY protocol header
        (``gateway.edge.proxyproto.ProxyHeader``) named, else ``peer``."""
        if header is None or header.addr is None or peer not in self.trusted:
            return peer
        addr: ClientAddr = header.addr
        return addr

    def resolve(self, peer: ClientAddr, headers: CIMultiDictProxy[str]) -> ClientAddr:
        """The client address for this request; ``peer`` unless a trusted peer says otherwise."""
        if not self.trusted or peer not in self.trusted:
            return peer
        values = headers.getall(self.header, ())
        if not values:
            return peer
        entries = ",".join(values).split(",")
        addr = peer
        while entries:
            candidate = entries.pop().strip()
            if not candidate and entries:
                continue
            parsed = parse_addr(candidate)
            if parsed is None:
                break
            addr = parsed
            if not self.recursive or addr not in self.trusted:
                break
        return addr
