"""nginx's smooth weighted round-robin and max_fails / fail_timeout, with a fake clock."""

from __future__ import annotations

from gateway.config.upstreams import ServerSpec
from gateway.proxy.balancer import Balancer


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def servers(*specs: dict) -> list[ServerSpec]:
    return [ServerSpec(host="127.0.0.1", port=9000 + i, **s) for i, s in enumerate(specs)]


def picks(b: Balancer, n: int) -> list[int]:
    out = []
    for _ in range(n):
        peer = b.pick(set())
        assert peer is not None
        b.report(peer, failed=False)
        out.append(peer.index)
    return out


def test_smooth_weighted_sequence_matches_nginx():
    # nginx's documented example: weights 5, 1, 1 give a, a, b, a, c, a, a.
    b = Balancer(servers({"weight": 5}, {}, {}), Clock())
    assert picks(b, 7) == [0, 0, 1, 0, 2, 0, 0]


def test_failed_server_is_skipped_until_fail_timeout_then_probed():
    clock = Clock()
    b = Balancer(servers({"max_fails": 2, "fail_timeout_ms": 10_000}, {}), clock)
    first = b.pick(set())
    assert first is not None and first.index == 0
    assert b.report(first, failed=True) is False
    p = b.pick(set())
    assert p is not None
    b.report(p, failed=False)
    # second failure of server 0 disables it
    while (p := b.pick(set())) is not None and p.index != 0:
        b.report(p, failed=False)
    assert p is not None and b.report(p, failed=True) is True
    assert picks(b, 5) == [1] * 5
    clock.now += 10_001
    # Once fail_timeout has passed it is eligible again (smooth round-robin decides when),
    # and one success resets its failure count.
    after = picks(b, 4)
    assert after.count(0) == 2
    assert b.peers[0].fails == 0


def test_single_server_is_never_marked_down():
    b = Balancer(servers({}), Clock())
    peer = b.pick(set())
    assert peer is not None
    for _ in range(5):
        b.report(peer, failed=True)
    assert b.pick(set()) is peer
    assert b.pick({peer.index}) is None  # but it is not retried within one request


def test_backup_is_used_only_when_primaries_are_down():
    clock = Clock()
    b = Balancer(servers({}, {"backup": True}), clock)
    assert picks(b, 3) == [0, 0, 0]
    primary = b.pick(set())
    assert primary is not None
    b.report(primary, failed=True)
    assert picks(b, 2) == [1, 1]
    assert b.pick({0}).index == 1  # type: ignore[union-attr]


def test_down_servers_are_never_picked():
    b = Balancer(servers({"down": True}, {}), Clock())
    assert picks(b, 3) == [1, 1, 1]
