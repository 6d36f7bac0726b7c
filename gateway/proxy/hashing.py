"""nginx's hash balancing, without I/O: ``ip_hash``, ``hash $key`` and ``hash $key consistent``.

Each follows nginx's module to the bit (``ngx_http_upstream_ip_hash_module.c`` and
``ngx_http_upstream_hash_module.c``), so a key lands on the server nginx would pick for it;
tests/differential/test_hash_balancing.py checks that against the nginx binary.

* ``ip_hash``: ``hash = 89``, then for each of the first three octets of an IPv4 address
  (or the 16 bytes of an IPv6 one) ``hash = (hash * 113 + byte) % 6271``; the server is found
  by walking the weights with ``hash % total_weight``. A server marked ``down`` keeps its slot
  (its weight counts): when the walk lands on a server that cannot be used, the loop hashes
  again from the current value, up to 20 times, then nginx falls back to round-robin.
* ``hash $key``: ``hash += (crc32([REHASH] key) >> 16) & 0x7fff`` (compatible with
  Cache::Memcached; the decimal rehash count is prefixed from the second try on), and the
  walk uses ``hash % total_weight``; 20 tries, then round-robin.
* ``hash $key consistent``: a ketama ring. Each server contributes ``160 * weight`` points:
  ``base = crc32(host + "\\0" + port)`` (``host`` alone, without a port, for ``unix:`` servers),
  each point ``crc32`` of ``base`` continued with the previous point as 4 little-endian bytes.
  Points are sorted (equal hashes kept once); a key's ``crc32`` finds the first point at or
  above it, wrapping, and a server that cannot be used passes to the next point (20 tries).

``usable(index)`` says whether a server may be picked now (not ``down``, not failed, not
already tried); a result of None means: fall back to round-robin, as nginx does.
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Callable, Sequence

MAX_TRIES = 20  # nginx: after 20 unusable picks, round-robin decides
POINTS_PER_WEIGHT = 160

Usable = Callable[[int], bool]


def _walk(weights: Sequence[int], w: int) -> int:
    """The server whose slot holds ``w`` (0 <= w < total weight)."""
    index = 0
    while w >= weights[index]:
        w -= weights[index]
        index += 1
    return index


def ip_hash_key(packed: bytes) -> bytes:
    """The bytes ip_hash uses: the first three octets of IPv4, the whole IPv6 address."""
    return packed[:3] if len(packed) == 4 else packed


def ip_hash_pick(packed: bytes, weights: Sequence[int], usable: Usable) -> int | None:
    """The server for a client address (4 or 16 packed bytes), or None: round-robin."""
    total = sum(weights)
    if total <= 0 or len(weights) == 1:
        return None
    key = ip_hash_key(packed)
    h = 89
    for _ in range(MAX_TRIES + 1):
        for byte in key:
            h = (h * 113 + byte) % 6271
        index = _walk(weights, h % total)
        if usable(index):
            return index
    return None


def hash_pick(key: bytes, weights: Sequence[int], usable: Usable) -> int | None:
    """``hash $key`` without ``consistent``: the server for ``key``, or None: round-robin
    (an empty key, a single server, or 20 unusable picks)."""
    total = sum(weights)
    if not key or total <= 0 or len(weights) == 1:
        return None
    h = 0
    for rehash in range(MAX_TRIES + 1):
        crc = zlib.crc32(key, zlib.crc32(str(rehash).encode())) if rehash else zlib.crc32(key)
        h += (crc >> 16) & 0x7FFF
        index = _walk(weights, h % total)
        if usable(index):
            return index
    return None


def _host_port(name: str) -> tuple[bytes, bytes]:
    """How nginx splits a server's name for its ring: ``unix:`` paths keep no port; otherwise the
    digits after the last ``:`` are the port."""
    raw = name.encode()
    if raw[:5].lower() == b"unix:":
        return raw[5:], b""
    for digits, c in enumerate(reversed(raw)):
        if c == ord(":"):
            return raw[: len(raw) - digits - 1], raw[len(raw) - digits :]
        if not 48 <= c <= 57:
            break
    return raw, b""


class ConsistentRing:
    """The ketama ring of ``hash $key consistent`` over servers ``(name, weight)`` as written in
    the configuration (``host:port`` or ``unix:/path``)."""

    def __init__(self, servers: Sequence[tuple[str, int]]) -> None:
        points: list[tuple[int, int]] = []
        for index, (name, weight) in enumerate(servers):
            host, port = _host_port(name)
            base = zlib.crc32(port, zlib.crc32(b"\0", zlib.crc32(host)))
            prev = 0
            for _ in range(POINTS_PER_WEIGHT * weight):
                prev = zlib.crc32(prev.to_bytes(4, "little"), base)
                points.append((prev, index))
        points.sort(key=lambda p: p[0])  # a stable sort: equal hashes keep the first server's
        unique: list[tuple[int, int]] = []
        for point in points:
            if not unique or unique[-1][0] != point[0]:
                unique.append(point)
        self.hashes = [h for h, _ in unique]
        self.servers = [s for _, s in unique]
        self.names = [name for name, _ in servers]

    def pick(self, key: bytes, usable: Usable) -> int | None:
        """The server for ``key``, or None: round-robin (an empty key, or 20 unusable points)."""
        if not key or not self.hashes:
            return None
        at = bisect.bisect_left(self.hashes, zlib.crc32(key))
        count = len(self.hashes)
        for tries in range(MAX_TRIES + 1):
            index = self.servers[(at + tries) % count]
            if usable(index):
                return index
        return None
