"""nginx's weighted round-robin with passive health checks, without I/O.

This follows ``ngx_http_upstream_round_robin.c``:

* smooth weighted round-robin: every pick adds each live peer's effective weight
  to its current weight, takes the largest, and subtracts the total from it;
* a failure adds to ``fails`` and lowers the effective weight by
  ``weight / max_fails``; once ``fails >= max_fails`` the peer is skipped until
  ``fail_timeout`` has passed since the last failure; the next pick after that
  probes it, and one success resets ``fails``;
* a group with a single server (and no backups) never marks it down;
* backup servers are used only when no primary server is available.

With ``balance: least_conn`` (``ngx_http_upstream_least_conn_module.c``) the live peer with the
fewest connections relative to its weight is picked (``conns_a * weight_b < conns_b * weight_a``),
and among equals smooth weighted round-robin decides, over those equals only. ``conns`` counts a
peer's requests from its pick until the caller lets go (``nextupstream.NextUpstream``); every
balancing method keeps it, as nginx does, but only ``least_conn`` reads it. It is per worker
process, as in nginx without a shared ``zone``.

With ``balance: ip_hash`` or ``hash $key [consistent]`` (``gateway.proxy.hashing``), the
request's address or key chooses the server, skipping those down, failed or tried; when that
finds none (or there is no key), round-robin decides, as in nginx.

Time is an integer millisecond clock passed in by the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.config.upstreams import BalanceSpec, ServerSpec
from gateway.http.keys import MAX_MAX_KEY, compile_key
from gateway.proxy.hashing import ConsistentRing, hash_pick, ip_hash_pick

if TYPE_CHECKING:
    from gateway.http.context import RequestContext


@dataclass(slots=True)
class Peer:
    spec: ServerSpec
    index: int
    weight: int
    max_fails: int
    fail_timeout_ms: int
    down: bool
    effective_weight: int
    current_weight: int = 0
    fails: int = 0
    accessed: int = 0
    checked: int = 0
    conns: int = 0  # requests holding this peer now (least_conn's measure)

    @property
    def address(self) -> str:
        return self.spec.address


class _Group:
    def __init__(self, peers: list[Peer]) -> None:
        self.peers = peers
        self.single = len(peers) == 1

    def pick(self, now: int, tried: set[int]) -> Peer | None:
        if self.single:
            peer = self.peers[0]
            if peer.down or peer.index in tried:
                return None
            return peer
        best: Peer | None = None
        total = 0
        for peer in self.peers:
            if peer.index in tried or peer.down:
                continue
            if peer.max_fails and peer.fails >= peer.max_fails and now - peer.checked <= peer.fail_timeout_ms:
                continue
            peer.current_weight += peer.effective_weight
            total += peer.effective_weight
            if peer.effective_weight < peer.weight:
                peer.effective_weight += 1
            if best is None or peer.current_weight > best.current_weight:
                best = peer
        if best is None:
            return None
        best.current_weight -= total
        if now - best.checked > best.fail_timeout_ms:
            best.checked = now
        return best

    def pick_least_conn(self, now: int, tried: set[int]) -> Peer | None:
        """nginx's least_conn: the fewest ``conns`` per unit of weight; among equals, smooth
        weighted round-robin over those equals only (nginx's second, "many" loop)."""
        if self.single:
            return self.pick(now, tried)
        live = [
            peer
            for peer in self.peers
            if peer.index not in tried
            and not peer.down
            and not (peer.max_fails and peer.fails >= peer.max_fails and now - peer.checked <= peer.fail_timeout_ms)
        ]
        if not live:
            return None
        best = live[0]
        tied = [best]
        for peer in live[1:]:
            if peer.conns * best.weight < best.conns * peer.weight:
                best = peer
                tied = [peer]
            elif peer.conns * best.weight == best.conns * peer.weight:
                tied.append(peer)
        if len(tied) > 1:
            total = 0
            for peer in tied:
                peer.current_weight += peer.effective_weight
                total += peer.effective_weight
                if peer.effective_weight < peer.weight:
                    peer.effective_weight += 1
                if peer.current_weight > best.current_weight:
                    best = peer
            best.current_weight -= total
        if now - best.checked > best.fail_timeout_ms:
            best.checked = now
        return best


class Balancer:
    """Chooses servers of one upstream and keeps their health, per worker process."""

    def __init__(
        self, servers: Sequence[ServerSpec], clock_ms: Callable[[], int], balance: BalanceSpec | None = None
    ) -> None:
        self._clock_ms = clock_ms
        peers = [
            Peer(
                spec=s,
                index=i,
                weight=s.weight,
                max_fails=s.max_fails,
                fail_timeout_ms=s.fail_timeout_ms,
                down=s.down,
                effective_weight=s.weight,
            )
            for i, s in enumerate(servers)
        ]
        primary = [p for p in peers if not p.spec.backup]
        backup = [p for p in peers if p.spec.backup]
        self.primary = _Group(primary)
        self.backup = _Group(backup) if backup else None
        if self.backup is not None:
            self.primary.single = False
            self.backup.single = False
        self.peers = tuple(peers)
        self.weights = [p.weight for p in peers]
        self.hashed: Callable[[RequestContext, Callable[[int], bool]], int | None] | None = None
        self.least_conn = balance is not None and balance.method == "least_conn"
        if balance is not None and balance.method == "ip_hash":
            self.hashed = self._ip_hash
        elif balance is not None and balance.method == "hash" and balance.key is not None:
            self.key = compile_key(balance.key, max_key=MAX_MAX_KEY)
            if balance.consistent:
                self.ring = ConsistentRing([(s.address, s.weight) for s in servers])
                self.hashed = self._consistent
            else:
                self.hashed = self._hash

    def _ip_hash(self, ctx: RequestContext, usable: Callable[[int], bool]) -> int | None:
        packed = ctx.client.packed
        return ip_hash_pick(packed, self.weights, usable) if len(packed) in (4, 16) else None

    def _hash(self, ctx: RequestContext, usable: Callable[[int], bool]) -> int | None:
        return hash_pick(self.key(ctx), self.weights, usable)

    def _consistent(self, ctx: RequestContext, usable: Callable[[int], bool]) -> int | None:
        return self.ring.pick(self.key(ctx), usable)

    def pick(self, tried: set[int], ctx: RequestContext | None = None) -> Peer | None:
        """The next server to try, skipping those in ``tried``; None when none is available.
        ``ctx``: the request, which ``ip_hash`` and ``hash`` choose by."""
        now = self._clock_ms()
        if self.hashed is not None and ctx is not None:
            peers = self.peers

            def usable(index: int) -> bool:
                peer = peers[index]
                if index in tried or peer.down:
                    return False
                return not (
                    peer.max_fails and peer.fails >= peer.max_fails and now - peer.checked <= peer.fail_timeout_ms
                )

            index = self.hashed(ctx, usable)
            if index is not None:
                chosen = peers[index]
                if now - chosen.checked > chosen.fail_timeout_ms:
                    chosen.checked = now
                return chosen
        if self.least_conn:
            peer = self.primary.pick_least_conn(now, tried)
            if peer is None and self.backup is not None:
                peer = self.backup.pick_least_conn(now, tried)
            return peer
        peer = self.primary.pick(now, tried)
        if peer is None and self.backup is not None:
            peer = self.backup.pick(now, tried)
        return peer

    def report(self, peer: Peer, failed: bool) -> bool:
        """Record how an attempt ended; returns True when this failure disabled the peer."""
        now = self._clock_ms()
        if failed:
            if (self.primary.single and peer in self.primary.peers) or not peer.max_fails:
                return False
            peer.fails += 1
            peer.accessed = now
            peer.checked = now
            peer.effective_weight -= peer.weight // peer.max_fails
            if peer.effective_weight < 0:
                peer.effective_weight = 0
            return peer.fails == peer.max_fails
        if peer.accessed < peer.checked:
            peer.fails = 0
        return False

    @property
    def live_count(self) -> int:
        return len(self.peers)
