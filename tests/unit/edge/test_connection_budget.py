"""The connection budget under an open file limit, and what the limiter reclaims at it."""

from __future__ import annotations

import ipaddress
import time

import pytest

from gateway.edge.connections import GRACE_S, ConnectionCaps, ConnectionLimiter
from gateway.edge.settings import PROCESS_RESERVE, connection_budget, edge_settings
from gateway.errors import ConfigErrors
from gateway.http.realip import NetworkSet, parse_addr
from gateway.plan import load_config_text

BASE = """
listen: 127.0.0.1:8080
upstreams:
  app: {servers: [127.0.0.1:9000], keepalive: 32}
routes:
  - {location: /, upstream: app}
"""


def test_the_open_file_limit_sets_the_budget_when_it_allows_less_than_worker_connections():
    spec = load_config_text(BASE).spec
    budget = connection_budget(spec, 1024)
    reserve = PROCESS_RESERVE + 1 + 32  # the process, one listener, the upstream's idle keep-alive
    assert budget.connections == (1024 - reserve) // 2 == 463
    assert budget.fd_bound
    assert budget.message.startswith(
        "worker_connections 10240 need more descriptors than the open file limit 1024 allows: serving at most 463 client connections"
    )
    assert f"reserve {reserve}" in budget.message
    assert connection_budget(spec, 4096).connections == (4096 - reserve) // 2


def test_worker_connections_sets_it_when_the_limit_allows_more():
    spec = load_config_text(BASE + "worker_connections: 1000\n").spec
    budget = connection_budget(spec, 1 << 20)
    assert budget.connections == 1000 and not budget.fd_bound
    assert budget.message.startswith("serving at most 1000 client connections (worker_connections;")


def test_a_redis_pool_and_more_listeners_take_their_share():
    text = BASE.replace("listen: 127.0.0.1:8080", "listen: [127.0.0.1:8080, 127.0.0.1:8081]")
    text += "store: {redis: {url: 'redis://127.0.0.1:6379', pool_size: 100}}\n"
    spec = load_config_text(text).spec
    assert connection_budget(spec, 1024).connections == (1024 - PROCESS_RESERVE - 2 - 32 - 100) // 2


def test_edge_settings_carry_the_budget_and_the_floor_rate():
    spec = load_config_text(BASE + "client_body_min_rate: 4k\n").spec
    settings = edge_settings(spec, 1024)
    assert settings.caps.worker_connections == 463
    assert settings.caps.min_body_rate == 4096
    assert "open file limit" in settings.caps.limit_name
    assert load_config_text(BASE).spec.edge.client_body_min_rate == 1024  # the default: 1k a second
    assert load_config_text(BASE + "client_body_min_rate: 0\n").spec.edge.client_body_min_rate == 0  # off


def test_a_bad_floor_rate_is_a_config_error():
    with pytest.raises(ConfigErrors, match="client_body_min_rate"):
        load_config_text(BASE + "client_body_min_rate: fast\n")


# -- reclaiming at the budget ----------------------------------------------------------------------


class Conn:
    """A connection as the limiter sees it; ``body`` = (began, received, paused) while one arrives."""

    def __init__(self, limiter: ConnectionLimiter, addr: str) -> None:
        self.limiter = limiter
        peer = parse_addr(addr)
        assert peer is not None
        self.key = limiter.admit(self, peer)
        self.evicted = False
        self.body: tuple[float, int, bool] | None = None

    def evict(self) -> None:
        self.evicted = True
        assert self.key is not None
        self.limiter.release(self, self.key)

    def body_progress(self) -> tuple[float, int, bool] | None:
        return self.body

    def sending(self, began: float, received: int, paused: bool = False) -> Conn:
        self.body = (began, received, paused)
        self.limiter.receiving_body(self)
        return self


def limiter(total: int, rate: int = 1024) -> ConnectionLimiter:
    caps = ConnectionCaps(worker_connections=total, max_per_ip=0, exempt=NetworkSet(()), min_body_rate=rate)
    return ConnectionLimiter(caps)


def age(lim: ConnectionLimiter, conn: Conn, seconds: float) -> None:
    """Make ``conn`` reusable since ``seconds`` ago (keeping the oldest-first order)."""
    lim.reusable.pop(conn)
    lim.reusable = {conn: time.monotonic() - seconds, **lim.reusable}


def test_slow_bodies_make_room_before_a_connection_that_just_arrived():
    lim = limiter(40)
    now = time.monotonic()
    slow = [Conn(lim, f"198.51.100.{i}").sending(now - 5, 100) for i in range(1, 20)]  # 100 bytes in 5 s
    fair = [Conn(lim, f"203.0.113.{i}").sending(now - 5, 50_000) for i in range(1, 20)]  # 10 kB/s
    waiting = [Conn(lim, f"203.0.114.{i}") for i in range(1, 3)]  # accepted, nothing parsed yet
    assert lim.total == 40
    newcomer = Conn(lim, "192.0.2.1")
    assert newcomer.key is not None
    assert all(c.evicted for c in slow)
    assert not any(c.evicted for c in fair + waiting)


def test_idle_connections_past_their_grace_go_first():
    lim = limiter(3)
    now = time.monotonic()
    idle = Conn(lim, "198.51.100.1")
    age(lim, idle, GRACE_S + 1)
    slow = Conn(lim, "198.51.100.2").sending(now - 5, 0)
    fresh = Conn(lim, "198.51.100.3")
    assert Conn(lim, "192.0.2.1").key is not None
    assert idle.evicted and not slow.evicted and not fresh.evicted


def test_a_body_in_its_first_second_goes_only_when_nothing_else_is_behind():
    lim = limiter(3)
    now = time.monotonic()
    young_slow = Conn(lim, "198.51.100.1").sending(now - 0.5, 10)  # 10 bytes in 0.5 s: behind, in its grace
    fast = Conn(lim, "198.51.100.2").sending(now - 0.5, 100_000)
    fresh = Conn(lim, "198.51.100.3")
    assert Conn(lim, "192.0.2.1").key is not None
    assert young_slow.evicted and not fast.evicted and not fresh.evicted


def test_bodies_keeping_up_or_paused_by_the_gateway_are_never_taken():
    lim = limiter(2)
    now = time.monotonic()
    paused = Conn(lim, "198.51.100.1").sending(now - 30, 0, paused=True)  # the gateway stopped reading
    done = Conn(lim, "198.51.100.2").sending(now - 30, 0)
    done.body = None  # the whole body is in: waiting on its upstream
    assert Conn(lim, "192.0.2.1").key is None  # nothing to reclaim: refused
    assert not paused.evicted and not done.evicted
    assert done not in lim.receiving and paused in lim.receiving


def test_a_floor_rate_of_zero_reclaims_no_body():
    lim = limiter(1, rate=0)
    Conn(lim, "198.51.100.1").sending(time.monotonic() - 60, 0)
    assert Conn(lim, "192.0.2.1").key is None


def test_a_tls_connection_keeps_its_count_when_the_edge_protocol_takes_over():
    lim = ConnectionLimiter(
        ConnectionCaps(worker_connections=10, max_per_ip=2, exempt=NetworkSet([ipaddress.ip_network("10.0.0.0/8")]))
    )
    sniffer = Conn(lim, "198.51.100.7")
    protocol = object.__new__(Conn)
    protocol.limiter, protocol.key, protocol.evicted, protocol.body = lim, sniffer.key, False, None
    lim.replace(sniffer, protocol)
    assert sniffer not in lim.reusable and protocol in lim.reusable
    assert lim.total == 1 and lim.per_ip[sniffer.key or b""] == 1
    assert Conn(lim, "198.51.100.7").key is not None
    assert Conn(lim, "198.51.100.7").key is None  # the handed-over connection still counts


def test_at_the_budget_an_address_holding_its_share_waits_instead_of_taking_room():
    lim = limiter(64 * 10)  # a share of 10
    heavy = [Conn(lim, "198.51.100.1") for _ in range(10)]
    others = [Conn(lim, f"203.0.{i // 250}.{i % 250 + 1}") for i in range(630)]
    for conn in heavy + others:
        age(lim, conn, GRACE_S + 1)
    assert lim.total == 640
    assert Conn(lim, "198.51.100.1").key is None  # refused: it would have closed another's connection
    assert not any(c.evicted for c in heavy + others)
    assert Conn(lim, "192.0.2.1").key is not None  # a client with nothing yet gets room
    assert sum(c.evicted for c in heavy + others) == 32
