"""request.lua's arguments and replies: what goes in per route, and named results out."""

from __future__ import annotations

from typing import Any

from gateway.limits import conn as limit_conn
from gateway.limits import nginx_req
from gateway.limits.conn import ConnDecision
from gateway.limits.outcome import AlgoOutcome
from gateway.store.base import LimitSet, Verdict


def algo_params(limit: Any) -> list[Any]:
    """request.lua's four parameters of one algo zone: its type code, then three numbers."""
    return [limit.algo.code, *limit.algo.lua_args(limit.params)]


Item = tuple[str, int, bytes, bytes]  # (kind r/c/n/g, limit index, Redis key, raw key)


class ReplyLayout:
    """Where request.lua's reply puts each limit, for one shape of call: a route and the kinds
    and limit indices of the keys it carries (in the script's order r, c, n, g). Computed once
    per shape, with the call's fixed arguments, and shared by every reply of that shape."""

    __slots__ = (
        *("algo", "algo_at", "algo_pos", "conn", "conn_at", "conn_pos"),
        *("count", "count_at", "count_pos", "quota", "req", "req_pos"),
    )

    def __init__(self, kinds: list[tuple[str, int]], route: LimitSet) -> None:
        def of(kind: str) -> tuple[list[int], list[int]]:
            return [i for kd, i in kinds if kd == kind], [j for j, (kd, _) in enumerate(kinds) if kd == kind]

        self.req, self.req_pos = of("r")  # limit indices, and their positions in the call's part
        self.count, self.count_pos = of("c")
        self.conn, self.conn_pos = of("n")
        self.algo, self.algo_pos = of("g")
        self.count_at = 6 + len(self.req)  # count_fail, then used and reset per count key
        self.conn_at = self.count_at + 1 + 2 * len(self.count)  # conn_done, conn_fail, then counts
        self.algo_at = self.conn_at + 2 + len(self.conn)  # algo_fail, then 8 fields per algo key
        # the policy quota the gateway reports for a zone whose script does not know it (token)
        self.quota = [route.limit_algo[i].algo.quota(route.limit_algo[i].params) for i in self.algo]


class RequestReply:
    """request.lua's reply for one group of keys, decoded into named fields."""

    __slots__ = (
        *("_algo", "_part", "_reply", "algo_fail", "ban_ms", "conn_done", "conn_fail", "count_fail", "costs"),
        *("delay_index", "delay_ms", "fail_excess", "fail_index", "layout", "now_ms", "rc", "route"),
    )

    def __init__(
        self, layout: ReplyLayout, part: list[Item], reply: list[Any], costs: list[int], route: LimitSet, now_ms: int
    ) -> None:
        self.layout = layout
        self._part = part
        self._reply = reply
        self.rc, self.fail_index, self.fail_excess, self.ban_ms, self.delay_ms, self.delay_index = reply[:6]
        self.count_fail = reply[layout.count_at]
        self.conn_done = reply[layout.conn_at]
        self.conn_fail = reply[layout.conn_at + 1]
        at = layout.algo_at
        self.algo_fail = reply[at]
        self._algo = [reply[at + 1 + 8 * a : at + 9 + 8 * a] for a in range(len(layout.algo))]
        self.costs = costs
        self.route = route
        self.now_ms = now_ms

    # the keys, by kind: (limit index, raw key), or Redis keys
    @property
    def req_items(self) -> list[tuple[int, bytes]]:
        return [(i, self._part[j][3]) for i, j in zip(self.layout.req, self.layout.req_pos, strict=True)]

    @property
    def req_keys_redis(self) -> list[bytes]:
        return [self._part[j][2] for j in self.layout.req_pos]

    @property
    def count_keys(self) -> list[bytes]:
        return [self._part[j][2] for j in self.layout.count_pos]

    @property
    def conn_keys(self) -> list[bytes]:
        return [self._part[j][2] for j in self.layout.conn_pos]

    @property
    def algo_undo(self) -> list[tuple[bytes, str]]:
        """What undo.lua takes back from each passed algo key: (key, undo kind)."""
        route, costs = self.route, self.costs
        return [
            (self._part[j][2], route.limit_algo[i].algo.undo(route.limit_algo[i].params, costs[i], self.now_ms, fields))
            for i, j, fields in zip(self.layout.algo, self.layout.algo_pos, self._algo, strict=True)
            if fields[0] == 0 and costs[i] > 0
        ]

    # the results, by kind, for the limits that applied (a negative field: not evaluated)
    def excesses(self) -> list[tuple[int, int]]:
        req = self.layout.req
        return [(i, e) for i, e in zip(req, self._reply[6 : 6 + len(req)], strict=True) if e >= 0]

    def counts(self) -> list[tuple[int, int, int]]:
        count = self.layout.count
        n = len(count)
        if not n:
            return []
        at = self.layout.count_at + 1
        used, reset = self._reply[at : at + n], self._reply[at + n : at + 2 * n]
        return [(i, u, r) for i, u, r in zip(count, used, reset, strict=True) if u >= 0]

    def algo_outcomes(self) -> list[tuple[int, AlgoOutcome]]:
        # the script answers CL.THROTTLE's fields: limited first
        return [
            (i, AlgoOutcome(f[0] == 0, quota if quota is not None else f[1], f[2], f[3], f[4], f[5]))
            for i, f, quota in zip(self.layout.algo, self._algo, self.layout.quota, strict=True)
            if f[0] >= 0
        ]

    def conn_counts(self) -> list[tuple[int, int]]:
        conn = self.layout.conn
        at = self.layout.conn_at + 2
        return [(i, c) for i, c in zip(conn, self._reply[at : at + len(conn)], strict=True) if c >= 0]


class FullCall:
    """The request.lua call of a route whose every limit has its key, on a standalone Redis,
    for a route without algo zones: the common case, so its keys' heads, its fixed arguments
    and where its reply puts each result are worked out once per route, and a reply that
    passes the request everywhere is read straight into a ``Verdict`` (``passed``). Every
    other reply (a refusal, a ban, a delay that held back limit_conn) is decided by the
    store's general merge, which owns those rules."""

    __slots__ = (
        *("conn_at", "conn_from", "count_at", "heads", "kinds", "layout", "limits", "longest"),
        *("n_conn", "n_count", "n_req", "route", "tail", "tail_bytes"),
    )

    def __init__(
        self,
        route: LimitSet,
        kinds: list[tuple[str, int]],
        heads: list[bytes],
        tail: list[Any],
        tail_bytes: bytes,
        layout: ReplyLayout,
    ) -> None:
        self.route = route
        self.kinds = kinds  # (kind, limit index) per key, in the script's order r, c, n
        self.heads = heads  # b"<prefix><zone>:" per limit, in the script's order r, c, n
        self.tail = tail
        self.tail_bytes = tail_bytes
        self.layout = layout
        self.n_req, self.n_count, self.n_conn = len(route.limit_req), len(route.limit_count), len(route.limit_conn)
        self.limits = self.n_req + self.n_count + self.n_conn
        self.conn_from = self.n_req + self.n_count  # where the conn keys start among the call's keys
        # the longest key each limit takes (the general path skips a longer one); a count key has no bound
        self.longest = [nginx_req.MAX_KEY] * self.n_req + [1 << 62] * self.n_count + [limit_conn.MAX_KEY] * self.n_conn
        self.count_at = layout.count_at
        self.conn_at = layout.conn_at

    def keys(self, raw: list[bytes]) -> list[bytes] | None:
        """The call's Redis keys for the request's keys (r, c, n), or None when a limit has no
        usable key (the general path, which skips such a limit, takes the request)."""
        if len(raw) != self.limits:
            return None
        for key, longest in zip(raw, self.longest, strict=True):
            if not key or len(key) > longest:
                return None
        return [head + key for head, key in zip(self.heads, raw, strict=True)]

    def items(self, keys: list[bytes], raw: list[bytes]) -> list[Item]:
        """The call's keys as the general path lists them."""
        return [(kd, i, key, r) for (kd, i), key, r in zip(self.kinds, keys, raw, strict=True)]

    def passed(self, reply: list[Any], now: int, member: bytes, keys: list[bytes]) -> Verdict | None:
        """The verdict of a reply that passed the request in every zone (not in dry run), else None."""
        count_at, conn_at = self.count_at, self.conn_at
        if reply[0] != 1 or reply[count_at] != 0 or reply[conn_at + 1] != 0:
            return None
        verdict = Verdict(now_ms=now)
        delay_ms = 0
        if self.n_req:
            excesses: list[int | None] = [e if e >= 0 else None for e in reply[6:count_at]]
            index = reply[5] - 1  # the zone with the longest delay (the last one when none waits)
            if index >= 0:
                delay_ms = reply[4]
            verdict.req = nginx_req.ReqDecision(
                nginx_req.OK, index, (excesses[index] or 0) if index >= 0 else 0, delay_ms, excesses
            )
        if self.n_count:
            used = reply[count_at + 1 : count_at + 1 + self.n_count]
            reset = reply[count_at + 1 + self.n_count : conn_at]
            verdict.count_used = [u if u >= 0 else None for u in used]
            verdict.count_reset_ms = [r if u >= 0 else None for u, r in zip(used, reset, strict=True)]
        if self.n_conn and reply[conn_at]:
            if delay_ms:
                return None  # slots taken for a request that waits: the merge gives them back
            counts: list[int | None] = [c if c >= 0 else None for c in reply[conn_at + 2 : conn_at + 2 + self.n_conn]]
            verdict.conn = ConnDecision(-1, False, counts, [(key, member) for key in keys[self.conn_from :]])
        return verdict
