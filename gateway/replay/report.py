"""Counters per route and zone, in bounded memory, and the report as text, JSON or one HTML page."""

from __future__ import annotations

import html
import ipaddress
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gateway.replay.logread import Timing
from gateway.replay.simulate import DELAYED, REJECTED, Outcome

MAX_KEYS = 10_000  # distinct limited keys tracked per zone (the rarest are dropped beyond)
MAX_BUCKETS = 600  # timeline points per zone; buckets widen (x2) as the log grows longer
TOP = 10
UNRELIABLE = 10  # a busiest second is withheld when its late requests could change it by more than 1/10


@dataclass(slots=True)
class Timeline:
    width_s: int = 1
    start_s: int | None = None
    requests: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)

    def add(self, second: int, rejected: bool) -> None:
        if self.start_s is None:
            self.start_s = second
        index = max(0, second - self.start_s) // self.width_s
        while index >= MAX_BUCKETS:
            self.requests = [sum(self.requests[i : i + 2]) for i in range(0, len(self.requests), 2)]
            self.rejected = [sum(self.rejected[i : i + 2]) for i in range(0, len(self.rejected), 2)]
            self.width_s *= 2
            index = max(0, second - self.start_s) // self.width_s
        while len(self.requests) <= index:
            self.requests.append(0)
            self.rejected.append(0)
        self.requests[index] += 1
        self.rejected[index] += int(rejected)


@dataclass(slots=True)
class Tally:
    requests: int = 0
    passed: int = 0
    delayed: int = 0
    rejected: int = 0
    delays: Counter[int] = field(default_factory=Counter)  # ms -> count (delays are few distinct values)
    keys: Counter[bytes] = field(default_factory=Counter)
    second: int = -1
    second_count: int = 0
    busiest: tuple[int, int] = (0, -1)  # (count, unix second), requests replayed at their own time only
    late: int = 0  # requests replayed after their start (beyond the reorder window): not in a second's count
    timeline: Timeline = field(default_factory=Timeline)

    def add(self, t_ms: int, result: str, delay_ms: int, key: bytes | None, late_ms: int = 0) -> None:
        self.requests += 1
        if result == REJECTED:
            self.rejected += 1
        elif result == DELAYED:
            self.delayed += 1
            self.delays[delay_ms] += 1
        else:
            self.passed += 1
        if key is not None and result != "PASSED":
            self.keys[key] += 1
            if len(self.keys) > MAX_KEYS:
                for k, _ in self.keys.most_common()[MAX_KEYS // 2 :]:
                    del self.keys[k]
        if late_ms:
            self.late += 1
            self.timeline.add((t_ms - late_ms) // 1000, result == REJECTED)
            return
        second = t_ms // 1000
        if second != self.second:
            self.second, self.second_count = second, 0
        self.second_count += 1
        if self.second_count > self.busiest[0]:
            self.busiest = (self.second_count, second)
        self.timeline.add(second, result == REJECTED)

    def percentile(self, q: float) -> int:
        total = sum(self.delays.values())
        if not total:
            return 0
        rank = max(1, -(-int(total * q * 1000) // 1000))
        seen = 0
        for ms in sorted(self.delays):
            seen += self.delays[ms]
            if seen >= rank:
                return ms
        return max(self.delays)

    def busiest_withheld(self, window_ms: int) -> str:
        """Why the busiest second is not shown ("" when it is)."""
        if self.late * UNRELIABLE <= self.busiest[0]:
            return ""
        return (
            f"{self.late} of its requests were logged more than the {window_ms / 1000:g} s reorder window out of "
            f"order, so a second's count may be off by up to {self.late} (replay with a larger --reorder-window)"
        )

    def as_dict(self, key_text: Any, window_ms: int) -> dict[str, Any]:
        withheld = self.busiest_withheld(window_ms)
        shown = self.busiest[1] >= 0 and not withheld
        return {
            "requests": self.requests,
            "passed": self.passed,
            "delayed": self.delayed,
            "rejected": self.rejected,
            "delay_p50_ms": self.percentile(0.5),
            "delay_p99_ms": self.percentile(0.99),
            "top_limited_keys": [{"key": key_text(k), "count": n} for k, n in self.keys.most_common(TOP)],
            "busiest_second": {"unix": self.busiest[1], "requests": self.busiest[0]} if shown else None,
            "busiest_second_withheld": withheld or None,
            "late": self.late,
        }


@dataclass(slots=True)
class Report:
    timing: Timing
    lines: int = 0
    zones: dict[str, Tally] = field(default_factory=dict)
    routes: dict[str, Tally] = field(default_factory=dict)
    denied: int = 0
    binary_zones: frozenset[str] = frozenset()
    notes: list[str] = field(default_factory=list)

    def add(self, out: Outcome) -> None:
        self.lines += 1
        self.denied += int(out.denied)
        if out.status:
            result = REJECTED
        elif out.delay_ms:
            result = DELAYED
        else:
            result = "PASSED"
        _tally(self.routes, out.route).add(out.t_ms, result, out.delay_ms, None, out.late_ms)
        for z in out.zones:
            _tally(self.zones, z.zone).add(out.t_ms, z.result, z.delay_ms, z.key, out.late_ms)

    def key_text(self, zone: str) -> Any:
        binary = zone in self.binary_zones

        def text(key: bytes) -> str:
            if binary and len(key) in (4, 16):
                return str(ipaddress.ip_address(key))
            return key.decode("utf-8", "backslashreplace")

        return text

    def as_dict(self) -> dict[str, Any]:
        return {
            "lines": self.lines,
            "timing": {
                "precise_ms": self.timing.precise,
                "spread_within_second": self.timing.spread,
                "moved_to_start_by_request_time": self.timing.starts,
                "reorder_window_ms": self.timing.window_ms,
                "out_of_order_lines": self.timing.reordered,
                "most_out_of_order_ms": self.timing.most_out_of_order_ms,
                "out_of_order_beyond_window": self.timing.late,
                "beyond_window_by_request_time": self.timing.late_long,
                "most_late_ms": self.timing.latest_ms,
                "held_peak_lines": self.timing.held_peak,
                "ahead_outliers": self.timing.outliers,
                "ahead_outlier_lines": self.timing.outlier_lines,
                "unparsed_lines": self.timing.unparsed,
            },
            "notes": self.notes,
            "denied_by_access_rules": self.denied,
            "zones": {name: t.as_dict(self.key_text(name), self.timing.window_ms) for name, t in self.zones.items()},
            "routes": {name: t.as_dict(lambda k: "", self.timing.window_ms) for name, t in self.routes.items()},
        }

    def text(self) -> str:
        d = self.as_dict()
        lines = [f"{self.lines} requests replayed"]
        lines += [f"note: {n}" for n in self.notes]
        head = f"{'':24} {'requests':>9} {'passed':>9} {'delayed':>9} {'rejected':>9} {'p50 ms':>7} {'p99 ms':>7}"
        for section in ("zones", "routes"):
            lines += ["", section, head]
            for name, t in d[section].items():
                lines.append(
                    f"{name[:24]:24} {t['requests']:>9} {t['passed']:>9} {t['delayed']:>9} {t['rejected']:>9} "
                    f"{t['delay_p50_ms']:>7} {t['delay_p99_ms']:>7}"
                )
        for name, t in d["zones"].items():
            busiest = t["busiest_second"]
            if busiest:
                more = f", up to {t['late']} more replayed late" if t["late"] else ""
                lines.append(f"\nzone {name}: busiest second {busiest['unix']} ({busiest['requests']} requests{more})")
            elif t["busiest_second_withheld"]:
                lines.append(f"\nzone {name}: busiest second not shown: {t['busiest_second_withheld']}")
            for item in t["top_limited_keys"]:
                lines.append(f"  limited key {item['key']!s:40} {item['count']}")
        return "\n".join(lines) + "\n"

    def html(self) -> str:
        d = self.as_dict()
        parts = [
            "<!doctype html><html><head><meta charset='utf-8'><title>gateway replay</title>",
            "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}svg{background:#fafafa}</style>",
            "</head><body><h1>gateway replay</h1>",
            f"<p>{self.lines} requests replayed.</p>",
            *(f"<p><b>Note:</b> {html.escape(n)}</p>" for n in self.notes),
        ]
        for section in ("zones", "routes"):
            parts.append(f"<h2>{section}</h2><table><tr><th></th><th>requests</th><th>passed</th>"
                         "<th>delayed</th><th>rejected</th><th>p50 ms</th><th>p99 ms</th></tr>")  # fmt: skip
            for name, t in d[section].items():
                cells = "".join(
                    f"<td>{t[k]}</td>"
                    for k in ("requests", "passed", "delayed", "rejected", "delay_p50_ms", "delay_p99_ms")
                )
                parts.append(f"<tr><th>{html.escape(name)}</th>{cells}</tr>")
            parts.append("</table>")
        for name, tally in self.zones.items():
            parts.append(f"<h3>zone {html.escape(name)}: requests (grey) and rejections (red) per "
                         f"{tally.timeline.width_s} s</h3>")  # fmt: skip
            parts.append(_svg(tally.timeline))
        parts.append("</body></html>")
        return "\n".join(parts) + "\n"


def _tally(tallies: dict[str, Tally], name: str) -> Tally:
    tally = tallies.get(name)
    if tally is None:
        tally = tallies[name] = Tally()
    return tally


def _svg(t: Timeline, width: int = 900, height: int = 160) -> str:
    n = max(1, len(t.requests))
    top = max(t.requests, default=0) or 1
    step = width / n

    def points(values: list[int]) -> str:
        return " ".join(f"{i * step:.1f},{height - v * (height - 10) / top:.1f}" for i, v in enumerate(values))

    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}'>"
        f"<polyline fill='none' stroke='#888' points='{points(t.requests)}'/>"
        f"<polyline fill='none' stroke='#d00' points='{points(t.rejected)}'/>"
        f"<text x='4' y='12' font-size='11'>max {top}/bucket</text></svg>"
    )
