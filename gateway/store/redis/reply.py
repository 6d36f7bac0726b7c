"""request.lua's arguments and replies: what goes in per route, and named results out."""

from __future__ import annotations

from typing import Any

from gateway.limits.outcome import AlgoOutcome
from gateway.store.base import LimitSet


def algo_params(limit: Any) -> list[int]:
    """request.lua's four parameters of one algo zone: its type code, then three numbers."""
    if limit.type == "gcra":
        return [1, limit.gcra.emission_ns, limit.gcra.burst, 0]
    if limit.type == "token":
        return [3, limit.token.stable_us, limit.token.warmup_us, limit.token.max_delay_us]
    return [2, limit.log.limit, limit.log.window_ms, 0]


def _quota(limit: Any) -> int | None:
    """The policy quota the gateway reports for a zone whose script does not know it (token)."""
    return int(limit.rate_text.split("r/")[0]) if limit.type == "token" else None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _undo_kind(limit: Any, cost: int, now_ms: int, fields: list[Any]) -> str:
    """undo.lua's kind for a committed algo key."""
    if limit.type == "gcra":
        return f"g{limit.gcra.emission_ns * cost}:{now_ms}"
    if limit.type == "token":
        return f"t{_text(fields[6])}|{_text(fields[7])}"  # the value before, if it still holds ours
    return "n"  # sliding_log: remove the request's member, like a conn lease


Item = tuple[str, int, bytes, bytes]  # (kind r/c/n, limit index, Redis key, raw key)


class RequestReply:
    """request.lua's reply for one group of keys, decoded into named fields."""

    def __init__(self, part: list[Item], reply: list[Any], costs: list[int], route: LimitSet, now_ms: int) -> None:
        self.req_items = [(i, raw) for kd, i, _, raw in part if kd == "r"]
        self.req_keys_redis = [(i, key) for kd, i, key, _ in part if kd == "r"]
        self.count_items = [i for kd, i, _, _ in part if kd == "c"]
        self.count_keys = [key for kd, _, key, _ in part if kd == "c"]
        self.conn_items = [i for kd, i, _, _ in part if kd == "n"]
        self.conn_keys = [key for kd, _, key, _ in part if kd == "n"]
        self.rc, self.fail_index, self.fail_excess, self.ban_ms, self.delay_ms, self.delay_index = reply[:6]
        pos = 6
        self._excess = reply[pos : pos + len(self.req_items)]
        pos += len(self.req_items)
        self.count_fail = reply[pos]
        pos += 1
        n = len(self.count_items)
        self._used = reply[pos : pos + n]
        self._reset = reply[pos + n : pos + 2 * n]
        pos += 2 * n
        self.conn_done, self.conn_fail = reply[pos], reply[pos + 1]
        self._conn = reply[pos + 2 : pos + 2 + len(self.conn_items)]
        pos += 2 + len(self.conn_items)
        self.algo_items = [i for kd, i, _, _ in part if kd == "g"]
        self.algo_fail = reply[pos]
        self._algo = [reply[pos + 1 + 8 * a : pos + 9 + 8 * a] for a in range(len(self.algo_items))]
        self._quota = [_quota(route.limit_algo[i]) for i in self.algo_items]
        # what undo.lua takes back from each passed algo key: (key, undo kind)
        self.algo_undo = [
            (key, _undo_kind(route.limit_algo[i], costs[i], now_ms, fields))
            for (_, i, key, _), fields in zip([p for p in part if p[0] == "g"], self._algo, strict=True)
            if fields[0] == 0 and costs[i] > 0
        ]
        self.now_ms = now_ms

    def excesses(self) -> list[tuple[int, int]]:
        return [(i, e) for (i, _), e in zip(self.req_items, self._excess, strict=True) if e >= 0]

    def counts(self) -> list[tuple[int, int, int]]:
        return [(i, u, r) for i, u, r in zip(self.count_items, self._used, self._reset, strict=True) if u >= 0]

    def algo_outcomes(self) -> list[tuple[int, AlgoOutcome]]:
        # the script answers CL.THROTTLE's fields: limited first
        return [
            (i, AlgoOutcome(f[0] == 0, quota if quota is not None else f[1], f[2], f[3], f[4], f[5]))
            for i, f, quota in zip(self.algo_items, self._algo, self._quota, strict=True)
            if f[0] >= 0
        ]

    def conn_counts(self) -> list[tuple[int, int]]:
        return [(i, c) for i, c in zip(self.conn_items, self._conn, strict=True) if c >= 0]
