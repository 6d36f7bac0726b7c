"""``balance: least_conn`` as ngx_http_upstream_least_conn_module.c picks, with a fake clock: the
fewest connections per unit of weight, weighted round-robin among equals only, down and failed
servers passed over, backups last; and the unix: server spelling of ``servers:``."""

from __future__ import annotations

import pytest

from gateway.config.upstreams import BalanceSpec, ServerSpec, parse_balance
from gateway.errors import ConfigErrors
from gateway.plan.load import load_config
from gateway.proxy.balancer import Balancer, Peer

LEAST_CONN = BalanceSpec("least_conn")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def balancer(*specs: dict, clock: Clock | None = None) -> Balancer:
    servers = [ServerSpec(host="127.0.0.1", port=9000 + i, **s) for i, s in enumerate(specs)]
    return Balancer(servers, clock or Clock(), LEAST_CONN)


def take(b: Balancer, tried: set[int] | None = None) -> Peer:
    """One pick, counted as NextUpstream counts it (held until let go)."""
    peer = b.pick(tried or set())
    assert peer is not None
    peer.conns += 1
    return peer


def test_the_server_with_fewest_connections_is_picked() -> None:
    b = balancer({}, {}, {})
    b.peers[0].conns, b.peers[1].conns, b.peers[2].conns = 3, 1, 2
    assert take(b).index == 1  # now 3, 2, 2: a tie of 1 and 2
    b.peers[2].conns = 5
    assert take(b).index == 1


def test_connections_are_compared_relative_to_weight() -> None:
    # conns_a * weight_b < conns_b * weight_a: 3 connections on weight 3 (1 per unit) beat 2 on weight 1
    b = balancer({"weight": 3}, {})
    b.peers[0].conns, b.peers[1].conns = 3, 2
    assert take(b).index == 0
    # 4 on weight 3 (1.33) against 2 on weight 1 (2): still the first; 6 on 3 (2) ties 2 on 1
    assert take(b).index == 0
    b.peers[0].conns = 7
    assert take(b).index == 1


def test_ties_go_weighted_round_robin_among_the_tied_only() -> None:
    # No request ever ends: each pick adds one. Weights 1, 1: the tie at 0, 0 goes to 0 (its
    # current_weight 1 -> -1), then 1 has fewer; at 1, 1 the tie goes round-robin: 1 (cw 2 -> 0)
    # beats 0 (cw 0); then 0 has fewer; at 2, 2: 0 (cw 1 -> -1); then 1. nginx's sequence.
    b = balancer({}, {})
    assert [take(b).index for _ in range(6)] == [0, 1, 1, 0, 0, 1]
    # Weights 2, 1 and nothing held: every pick is a tie; smooth round-robin gives 0, 1, 0, ...
    b = balancer({"weight": 2}, {})
    picks = []
    for _ in range(6):
        peer = b.pick(set())
        assert peer is not None
        picks.append(peer.index)
    assert picks == [0, 1, 0, 0, 1, 0]


def test_a_busier_server_keeps_no_round_robin_credit() -> None:
    # Server 0 is busy; 1 and 2 tie. Only the tied peers' current_weight moves (nginx's "many" loop).
    b = balancer({}, {}, {})
    b.peers[0].conns = 10
    first, second = take(b), take(b)
    assert (first.index, second.index) == (1, 2)
    assert b.peers[0].current_weight == 0


def test_down_failed_and_tried_servers_are_passed_over() -> None:
    clock = Clock()
    b = balancer({"down": True}, {"max_fails": 1, "fail_timeout_ms": 10_000}, {}, clock=clock)
    failed = b.peers[1]
    b.report(failed, failed=True)  # out for fail_timeout
    assert [take(b).index for _ in range(3)] == [2, 2, 2]
    assert b.pick({2}) is None  # the rest is down or failed
    clock.now += 10_001
    assert take(b).index == 1  # the failed one is back (and has the fewest connections)
    assert b.pick({1, 2}) is None  # the down one never is


def test_backups_only_when_no_primary_is_available() -> None:
    b = balancer({}, {"backup": True})
    b.peers[0].conns = 100
    assert take(b).index == 0  # a busy primary still wins over an idle backup
    assert take(b, {0}).index == 1
    assert parse_balance("least_conn") == LEAST_CONN


def test_a_single_server_is_never_marked_down() -> None:
    b = balancer({})
    peer = take(b)
    for _ in range(3):
        b.report(peer, failed=True)
    assert b.pick(set()) is peer


def _check(tmp_path, text: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "limits.yaml"
    path.write_text(text)
    return load_config(str(path))


def test_unix_servers_and_least_conn_in_the_config(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plan = _check(
        tmp_path,
        "listen: 127.0.0.1:8080\nupstreams:\n  app:\n    balance: least_conn\n"
        "    servers: [unix:/run/a.sock, {address: 'unix:/run/b.sock', weight: 3, backup: true}, 10.0.0.1:81]\n"
        "routes:\n  - {location: /, upstream: app}\n",
    )
    servers = plan.spec.upstreams["app"].servers
    assert [s.address for s in servers] == ["unix:/run/a.sock", "unix:/run/b.sock", "10.0.0.1:81"]
    assert (servers[0].path, servers[1].weight, servers[1].backup, servers[2].path) == ("/run/a.sock", 3, True, None)


@pytest.mark.parametrize(
    ("servers", "message"),
    [
        ("['unix:']", "no path in the unix domain socket"),
        ("['unix:/" + "x" * 120 + "']", "too long path"),
        ("[unix:/run/a.sock, unix:/run/a.sock]", "duplicate server unix:/run/a.sock"),
    ],
)
def test_bad_unix_servers_name_their_place(tmp_path, servers: str, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigErrors) as info:
        _check(tmp_path, f"listen: 127.0.0.1:8080\nupstreams:\n  app:\n    servers: {servers}\n")
    text = str(info.value)
    assert message in text and "limits.yaml:4" in text and "upstreams.app.servers" in text, text
