"""The connection limiter on its own: per-address caps (IPv6 by /64), exemptions, reuse order."""

from __future__ import annotations

import ipaddress

from gateway.edge.connections import ConnectionCaps, ConnectionLimiter
from gateway.http.realip import NetworkSet, parse_addr


class Conn:
    """A connection as the limiter sees it: something it can evict."""

    def __init__(self, limiter: ConnectionLimiter, addr: str) -> None:
        self.limiter = limiter
        peer = parse_addr(addr)
        assert peer is not None
        self.key = limiter.admit(self, peer)
        self.evicted = False

    def evict(self) -> None:
        self.evicted = True
        assert self.key is not None
        self.limiter.release(self, self.key)


def limiter(total: int = 100, per_ip: int = 3, exempt: tuple[str, ...] = ()) -> ConnectionLimiter:
    nets = NetworkSet(ipaddress.ip_network(n) for n in exempt)
    return ConnectionLimiter(ConnectionCaps(worker_connections=total, max_per_ip=per_ip, exempt=nets))


def test_ipv6_peers_count_by_their_64():
    lim = limiter(per_ip=3)
    same_64 = [Conn(lim, f"2001:db8:1:2::{i:x}") for i in range(1, 5)]
    assert [c.key is not None for c in same_64] == [True, True, True, False]
    assert Conn(lim, "2001:db8:1:3::1").key is not None  # the next /64 is another client
    assert Conn(lim, "2001:db8:1:2:ffff:ffff:ffff:ffff").key is None


def test_ipv4_counts_by_address_and_mapped_addresses_are_ipv4():
    lim = limiter(per_ip=2)
    assert Conn(lim, "192.0.2.1").key is not None
    assert Conn(lim, "::ffff:192.0.2.1").key is not None
    assert Conn(lim, "192.0.2.1").key is None
    assert Conn(lim, "192.0.2.2").key is not None


def test_trusted_proxies_are_exempt_and_a_release_gives_the_slot_back():
    lim = limiter(per_ip=1, exempt=("10.0.0.0/8",))
    assert all(Conn(lim, "10.1.2.3").key is not None for _ in range(50))
    first = Conn(lim, "198.51.100.7")
    assert Conn(lim, "198.51.100.7").key is None
    assert first.key is not None
    lim.release(first, first.key)
    assert Conn(lim, "198.51.100.7").key is not None
    assert lim.total == 51


def test_at_the_cap_the_oldest_reusable_connections_go_and_busy_ones_stay():
    lim = limiter(total=40, per_ip=0)
    conns = [Conn(lim, f"203.0.113.{i}") for i in range(1, 41)]
    lim.busy(conns[0])  # a request in flight: never taken
    lim.idle(conns[1])  # idle again just now: the youngest
    newcomer = Conn(lim, "203.0.113.200")
    assert newcomer.key is not None
    evicted = [c for c in conns if c.evicted]
    assert evicted == conns[2:34]  # a batch of 32, oldest first
    assert not conns[0].evicted and not conns[1].evicted
    assert lim.total == 40 - 32 + 1


def test_with_nothing_reusable_a_new_connection_is_refused():
    lim = limiter(total=16, per_ip=0)
    conns = [Conn(lim, f"203.0.113.{i}") for i in range(1, 17)]
    for conn in conns:
        lim.busy(conn)
    assert Conn(lim, "203.0.113.99").key is None
    assert lim.refused == 1 and not any(c.evicted for c in conns)
