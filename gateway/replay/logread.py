"""Access log lines to timed requests, streamed: nginx ``combined``, the gateway's formats, a template.

Times: ``$msec`` gives milliseconds. Without it only whole seconds are known
(``$time_local``, ``$time_iso8601``): the requests of one second are spread evenly
across it, in log order, once every line of that second has been read, and
``Timing.spread`` says so. nginx and the gateway log a request when it ends (``$msec``
and ``$time_local`` are the time of the log line); when ``$request_time`` is there the
request is placed at its start (end - request_time).

Lines come out of order in real logs (merged from several nodes; a slow request is
logged after faster later ones). They are put back in start order in a heap keyed by
time: a line is released once the log's clock (the latest logged time read) is a
reorder window past it (``DEFAULT_WINDOW_MS``, ``--reorder-window``), so memory is
bounded by the lines of one window (two with whole seconds and ``$request_time``:
the seconds are spread first, then ordered by start), not by the log. A line that
would have to be replayed before one already replayed is late: it is replayed at the
window's edge, and counted in ``Timing.late`` with how late it was.
"""

from __future__ import annotations

import gzip
import heapq
import io
import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import IO

from gateway.logs.formats import PRESETS, VARIABLE

DEFAULT_WINDOW_MS = 120_000  # merged logs of several nodes are out of order by tens of seconds
NEVER = -(2**62)
MAX_LINE = 64 * 1024  # longer lines are skipped (counted as unparsed), never held whole
LineParser = Callable[[str], dict[str, str] | None]


@dataclass(slots=True)
class Timing:
    window_ms: int = DEFAULT_WINDOW_MS  # the reorder window
    precise: bool = False  # $msec was in the format
    spread: bool = False  # whole seconds only: spread evenly
    starts: bool = False  # $request_time moved requests to their start
    reordered: int = 0  # lines logged after a later one (put back in order when within the window)
    most_out_of_order_ms: int = 0  # the furthest a line was logged after a later one
    late: int = 0  # beyond the window: replayed at the window's edge, after requests that started later
    late_long: int = 0  # of those, how many have a $request_time longer than the window
    latest_ms: int = 0  # the most a late request was moved
    held_peak: int = 0  # the most lines held at once for reordering
    unparsed: int = 0
    first_unparsed: str = ""


@dataclass(slots=True)
class LogRequest:
    t_ms: int  # start (estimated), on the log's clock; for a late request, the window's edge
    end_ms: int  # as logged
    fields: dict[str, str]
    late_ms: int = 0  # how much later than its start it was replayed (beyond the window)


def open_log(path: str) -> IO[str]:
    """A text stream over the file (gzip by its magic bytes), or stdin for ``-``."""
    raw: IO[bytes] = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115 - returned
    peek = raw.peek(2)[:2] if isinstance(raw, io.BufferedReader) else b""
    stream: IO[bytes] = gzip.GzipFile(fileobj=raw) if peek == b"\x1f\x8b" else raw  # type: ignore[assignment]
    return io.TextIOWrapper(stream, encoding="utf-8", errors="surrogateescape", newline="\n")


def lines_of(stream: IO[str]) -> Iterator[str]:
    """Lines of at most ``MAX_LINE`` characters; the rest of a longer line is read and dropped."""
    while True:
        line = stream.readline(MAX_LINE)
        if not line:
            return
        if len(line) == MAX_LINE and not line.endswith("\n"):
            while True:
                rest = stream.readline(MAX_LINE)
                if not rest or rest.endswith("\n"):
                    break
            yield "\x00overlong line"  # matches no format: counted as unparsed
            continue
        yield line


def template_of(fmt: str) -> str:
    return PRESETS.get(fmt, fmt)


def line_parser(fmt: str) -> tuple[LineParser, set[str]]:
    """A parser for one line of ``fmt`` and the variables it yields."""
    if fmt == "json":
        return _json_line, {"time_iso8601", "remote_addr", "request_method", "request_uri", "host", "status",
                            "request_time", "http_user_agent", "http_x_forwarded_for", "limit_req_status",
                            "limit_conn_status", "limit_count_status", "msec"}  # fmt: skip
    template = template_of(fmt)
    pattern: list[str] = ["^"]
    names: list[str] = []
    pos = 0
    matches = list(VARIABLE.finditer(template))
    for i, m in enumerate(matches):
        pattern.append(re.escape(template[pos : m.start()]))
        name = m.group(1) or m.group(2)
        following = template[m.end() : matches[i + 1].start() if i + 1 < len(matches) else len(template)]
        if following:
            pattern.append(f"([^{re.escape(following[0])}]*)")
        elif i + 1 == len(matches):
            pattern.append("(.*)")
        else:
            pattern.append("(\\S*)")
        names.append(name)
        pos = m.end()
    pattern.append(re.escape(template[pos:]) + "$")
    regex = re.compile("".join(pattern))
    count = len(names)

    def parse(line: str) -> dict[str, str] | None:
        m = regex.match(line)
        if m is None:
            return None
        values = m.groups()
        return {names[i]: ("" if values[i] == "-" else values[i]) for i in range(count)}

    return parse, set(names)


def _json_line(line: str) -> dict[str, str] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    return {str(k): ("" if v in ("-", None) else str(v)) for k, v in record.items()}


@lru_cache(maxsize=4096)
def _second_of_local(text: str) -> int:
    return int(datetime.strptime(text, "%d/%b/%Y:%H:%M:%S %z").timestamp())


@lru_cache(maxsize=4096)
def _second_of_iso(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp())


def _end_ms(fields: dict[str, str]) -> tuple[int, bool] | None:
    """The logged time in ms, and whether it is precise."""
    msec = fields.get("msec")
    if msec:
        return round(float(msec) * 1000), True
    local = fields.get("time_local")
    if local:
        return _second_of_local(local) * 1000, False
    iso = fields.get("time_iso8601")
    if iso:
        return _second_of_iso(iso) * 1000, False
    return None


def _request_ms(fields: dict[str, str]) -> int:
    value = fields.get("request_time", "")
    try:
        return round(float(value) * 1000) if value else 0
    except ValueError:
        return 0


def read_requests(
    lines: Iterable[str], parse: LineParser, timing: Timing, durations: bool = True
) -> Iterator[LogRequest]:
    """Parsed, timed requests in start order (streamed; memory bounded by the reorder window).

    ``durations``: the format may have ``$request_time``; False lets whole-second logs skip the
    second (start-order) window."""
    return _ordered(_timed(lines, parse, timing), timing, durations)


def _timed(lines: Iterable[str], parse: LineParser, timing: Timing) -> Iterator[tuple[int, bool, int, dict[str, str]]]:
    for line in lines:
        line = line.rstrip("\n")
        if not line:
            continue
        fields = parse(line)
        end = None
        if fields is not None:
            try:
                end = _end_ms(fields)
            except ValueError:
                end = None
        if fields is None or end is None:
            timing.unparsed += 1
            if not timing.first_unparsed:
                timing.first_unparsed = line[:200]
            continue
        yield end[0], end[1], _request_ms(fields), fields


Held = tuple[int, int, int, dict[str, str]]  # by start: (start, end, line number, fields); by second: (took, ...)


class _BySecond:
    """Lines held by the second they fall in: a list per second, in log order, and a heap of the
    seconds held, so a line costs an append, not a heap operation."""

    __slots__ = ("lists", "released", "seconds", "size")

    def __init__(self) -> None:
        self.lists: dict[int, list[Held]] = {}
        self.seconds: list[int] = []
        self.released = NEVER  # the last second handed out: a line for it or earlier comes too late
        self.size = 0

    def add(self, second: int, item: Held) -> bool:
        if second <= self.released:
            return False
        held = self.lists.get(second)
        if held is None:
            held = self.lists[second] = []
            heapq.heappush(self.seconds, second)
        held.append(item)
        self.size += 1
        return True

    def due(self, upto: int) -> bool:
        return bool(self.seconds) and self.seconds[0] <= upto

    def take(self) -> tuple[int, list[Held]]:
        """The earliest second held and its lines."""
        second = self.released = heapq.heappop(self.seconds)
        held = self.lists.pop(second)
        self.size -= len(held)
        return second, held


def _ordered(
    items: Iterator[tuple[int, bool, int, dict[str, str]]], timing: Timing, durations: bool
) -> Iterator[LogRequest]:
    window = timing.window_ms
    hold = window if durations else 0  # whole seconds: how long spread lines wait for earlier starts
    by_start = _BySecond()  # (start, end, line number, fields) by the second they start in
    by_end = _BySecond()  # whole seconds: (took, end, line number, fields) by their logged second
    newest = NEVER  # the latest logged time read: the log's clock
    edge = NEVER  # the start of the last request replayed: nothing can be replayed before it

    def now(start: int, end: int, took: int, fields: dict[str, str]) -> LogRequest:
        """Replayed at once: at its start if nothing later was replayed yet, else late, at the edge."""
        nonlocal edge
        if start >= edge:
            edge = start
            return LogRequest(start, end, fields)
        late = edge - start
        timing.late += 1
        timing.late_long += took > window
        timing.latest_ms = max(timing.latest_ms, late)
        return LogRequest(edge, end, fields, late)

    def released(upto: int) -> Iterator[LogRequest]:
        """The requests that started in the seconds up to ``upto``, in start order."""
        nonlocal edge
        while by_start.due(upto):
            _, held = by_start.take()
            held.sort()  # line numbers are unique: fields are never compared
            for start, end, _, fields in held:
                yield LogRequest(start, end, fields)
            edge = max(edge, held[-1][0])

    def spread(second: int, held: list[Held]) -> Iterator[LogRequest]:
        """One whole second's lines, spread evenly across it in log order, then held by start."""
        n = len(held)
        for i, (took, _, seq, fields) in enumerate(held):
            end = second * 1000 + i * 1000 // n
            if not durations:
                yield now(end, end, 0, fields)
            elif not by_start.add((end - took) // 1000, (end - took, end, seq, fields)):
                yield now(end - took, end, took, fields)

    for seq, (end, precise, took, fields) in enumerate(items):
        if took:
            timing.starts = True
        if end >= newest:
            newest = end
        else:
            timing.reordered += 1
            if newest - end > timing.most_out_of_order_ms:
                timing.most_out_of_order_ms = newest - end
        if precise:
            timing.precise = True
            if not by_start.add((end - took) // 1000, (end - took, end, seq, fields)):
                yield now(end - took, end, took, fields)
            upto = (newest - window) // 1000 - 1  # whole seconds a window behind the log's clock
        else:
            timing.spread = True
            if by_end.add(end // 1000, (took, end, seq, fields)):
                pass
            elif not durations or not by_start.add((end - took) // 1000, (end - took, end, seq, fields)):
                yield now(end - took, end, took, fields)  # its second was spread already
            upto = (newest - window) // 1000
            while by_end.due(upto):
                yield from spread(*by_end.take())
            upto = (by_end.released * 1000 - hold) // 1000 - 1
        held = by_start.size + by_end.size
        if held > timing.held_peak:
            timing.held_peak = held
        yield from released(upto)
    while by_end.seconds:
        yield from spread(*by_end.take())
    yield from released(2**62)
