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
window's edge, and counted in ``Timing.late`` with how late it was. The clock itself is
guarded (``_unjumped``): one line far ahead of the others (a node with a wrong clock) does
not move it, or every later line would be late; it is replayed at the clock's time instead,
and counted in ``Timing.outliers``. ``--reorder-window`` is at most ``MAX_WINDOW_MS``.
"""

from __future__ import annotations

import gzip
import heapq
import io
import json
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import IO, Any

from gateway.logs.formats import PRESETS, VARIABLE

DEFAULT_WINDOW_MS = 120_000  # merged logs of several nodes are out of order by tens of seconds
NEVER = -(2**62)
MAX_WINDOW_MS = 3_600_000  # --reorder-window: the lines of one window are held, so at most 1h of the log
CONFIRM = 3  # lines within a window of each other, all a window ahead of the log's clock: the log moved there
LOOKAHEAD = 64  # lines of the clock's own time read after one far ahead: it was an outlier
MAX_OUTLIER_LINES = 5  # line numbers of outliers kept for the report
MAX_LINE = 64 * 1024  # longer lines are skipped (counted as unparsed), never held whole


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
    outliers: int = 0  # lines far ahead of the log's clock, alone: replayed at the clock's time, not their own
    most_ahead_ms: int = 0  # the furthest ahead of the clock an outlier was
    outlier_lines: list[int] = field(default_factory=list)  # the first few outliers' line numbers
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


JSON_VARIABLES = {"time_iso8601", "remote_addr", "request_method", "request_uri", "host", "status", "request_time",
                  "http_user_agent", "http_x_forwarded_for", "limit_req_status", "limit_conn_status",
                  "limit_count_status", "msec"}  # fmt: skip


class LineParser:
    """One line of a format to its fields (``parser(line)``). ``match``, ``value`` and ``fields``
    split that up: the times are read from the match, and a line held for reordering is kept as
    its text (a quarter of the memory of its fields) and matched again when it is released."""

    __slots__ = ("_at", "_names", "_regex")

    def __init__(self, regex: re.Pattern[str] | None, names: list[str]) -> None:
        self._regex = regex
        self._names = names
        self._at = {name: i + 1 for i, name in enumerate(names)}  # a repeated variable: its last value

    def __call__(self, line: str) -> dict[str, str] | None:
        m = self.match(line)
        return None if m is None else self.fields(m)

    def match(self, line: str) -> Any:
        assert self._regex is not None
        return self._regex.match(line)

    def value(self, m: Any, name: str) -> str:
        i = self._at.get(name)
        value: str = m.group(i) if i is not None else ""
        return "" if value == "-" else value

    def fields(self, m: Any) -> dict[str, str]:
        names = self._names
        values = m.groups()
        return {names[i]: ("" if values[i] == "-" else values[i]) for i in range(len(names))}


class _JsonParser(LineParser):
    __slots__ = ()

    def match(self, line: str) -> Any:
        try:
            record = json.loads(line)
        except ValueError:
            return None
        if not isinstance(record, dict):
            return None
        return {str(k): ("" if v in ("-", None) else str(v)) for k, v in record.items()}

    def value(self, m: Any, name: str) -> str:
        return str(m.get(name, ""))

    def fields(self, m: Any) -> dict[str, str]:
        return dict(m)


def line_parser(fmt: str) -> tuple[LineParser, set[str]]:
    """A parser for one line of ``fmt`` and the variables it yields."""
    if fmt == "json":
        return _JsonParser(None, []), set(JSON_VARIABLES)
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
    return LineParser(re.compile("".join(pattern)), names), set(names)


@lru_cache(maxsize=4096)
def _second_of_local(text: str) -> int:
    return int(datetime.strptime(text, "%d/%b/%Y:%H:%M:%S %z").timestamp())


@lru_cache(maxsize=4096)
def _second_of_iso(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp())


def _end_ms(parse: LineParser, m: Any) -> tuple[int, bool] | None:
    """The logged time in ms, and whether it is precise."""
    msec = parse.value(m, "msec")
    if msec:
        return round(float(msec) * 1000), True
    local = parse.value(m, "time_local")
    if local:
        return _second_of_local(local) * 1000, False
    iso = parse.value(m, "time_iso8601")
    if iso:
        return _second_of_iso(iso) * 1000, False
    return None


def _request_ms(parse: LineParser, m: Any) -> int:
    value = parse.value(m, "request_time")
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
    return _ordered(_unjumped(_timed(lines, parse, timing), timing), parse, timing, durations)


Item = tuple[int, int, bool, int, str]  # (line number, logged time in ms, precise, $request_time in ms, line)


def _timed(lines: Iterable[str], parse: LineParser, timing: Timing) -> Iterator[Item]:
    for number, line in enumerate(lines, 1):
        line = line.rstrip("\n")
        if not line:
            continue
        m = parse.match(line)
        end = None
        if m is not None:
            try:
                end = _end_ms(parse, m)
            except ValueError:
                end = None
        if end is None:
            timing.unparsed += 1
            if not timing.first_unparsed:
                timing.first_unparsed = line[:200]
            continue
        yield number, end[0], end[1], _request_ms(parse, m), line


def _unjumped(items: Iterator[Item], timing: Timing) -> Iterator[Item]:
    """The lines, with the log's clock kept from jumping to a line far ahead of the others.

    A line more than a window ahead of the clock (the latest time passed on) is held aside. It
    moves the clock when the log really moves there: ``CONFIRM`` lines held within a window of
    each other, or the log ending (nothing follows that it could make late). When ``LOOKAHEAD``
    lines of the clock's own time come first, or a line far from the held ones, they were
    outliers (a node with a wrong clock in a merged log): each is passed on at the clock's time,
    counted in ``Timing.outliers``. Before any clock, the first line is held the same way, so
    an outlier there cannot set it. At most ``CONFIRM - 1`` lines are ever held here."""
    window = timing.window_ms
    clock = NEVER
    held: list[Item] = []
    since = 0  # lines passed on since the first held one

    def outliers() -> Iterator[Item]:
        for number, end, precise, took, line in held:
            timing.outliers += 1
            timing.most_ahead_ms = max(timing.most_ahead_ms, end - clock)
            if len(timing.outlier_lines) < MAX_OUTLIER_LINES:
                timing.outlier_lines.append(number)
            yield number, clock, precise, took, line
        held.clear()

    def confirmed() -> Iterator[Item]:
        nonlocal clock
        yield from held
        clock = max(clock, *(item[1] for item in held))
        held.clear()

    for item in items:
        end = item[1]
        if held and abs(end - held[0][1]) <= window:  # near the held lines: one more says the log is there
            held.append(item)
            if len(held) >= CONFIRM:
                yield from confirmed()
            continue
        if clock == NEVER:
            if not held:
                held.append(item)
                since = 0
                continue
            if end > held[0][1]:  # later still: the held lines were the log's start, this one is ahead
                yield from confirmed()
            else:  # earlier: this line starts the clock; the held ones are ahead of it
                yield item
                clock = end
                since = 1
                continue
        if end > clock + window:
            if held:
                yield from outliers()
            held.append(item)
            since = 0
            continue
        yield item
        if end > clock:
            clock = end
        if held:
            since += 1
            if since >= LOOKAHEAD:
                yield from outliers()
    yield from held


Held = tuple[int, int, int, str]  # by start: (start, end, line number, line); by second: (took, ...)


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


def _ordered(items: Iterator[Item], parse: LineParser, timing: Timing, durations: bool) -> Iterator[LogRequest]:
    window = timing.window_ms
    hold = window if durations else 0  # whole seconds: how long spread lines wait for earlier starts
    by_start = _BySecond()  # (start, end, line number, line) by the second they start in
    by_end = _BySecond()  # whole seconds: (took, end, line number, line) by their logged second
    fields = parse.fields
    match = parse.match
    newest = NEVER  # the latest logged time read: the log's clock
    edge = NEVER  # the start of the last request replayed: nothing can be replayed before it

    def now(start: int, end: int, took: int, line: str) -> LogRequest:
        """Replayed at once: at its start if nothing later was replayed yet, else late, at the edge."""
        nonlocal edge
        if start >= edge:
            edge = start
            return LogRequest(start, end, fields(match(line)))
        late = edge - start
        timing.late += 1
        timing.late_long += took > window
        timing.latest_ms = max(timing.latest_ms, late)
        return LogRequest(edge, end, fields(match(line)), late)

    def released(upto: int) -> Iterator[LogRequest]:
        """The requests that started in the seconds up to ``upto``, in start order."""
        nonlocal edge
        while by_start.due(upto):
            _, held = by_start.take()
            held.sort()  # line numbers are unique: lines are never compared
            for start, end, _, line in held:
                yield LogRequest(start, end, fields(match(line)))
            edge = max(edge, held[-1][0])

    def spread(second: int, held: list[Held]) -> Iterator[LogRequest]:
        """One whole second's lines, spread evenly across it in log order, then held by start."""
        n = len(held)
        for i, (took, _, seq, line) in enumerate(held):
            end = second * 1000 + i * 1000 // n
            if not durations:
                yield now(end, end, 0, line)
            elif not by_start.add((end - took) // 1000, (end - took, end, seq, line)):
                yield now(end - took, end, took, line)

    for seq, end, precise, took, line in items:
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
            if not by_start.add((end - took) // 1000, (end - took, end, seq, line)):
                yield now(end - took, end, took, line)
            upto = (newest - window) // 1000 - 1  # whole seconds a window behind the log's clock
        else:
            timing.spread = True
            if by_end.add(end // 1000, (took, end, seq, line)):
                pass
            elif not durations or not by_start.add((end - took) // 1000, (end - took, end, seq, line)):
                yield now(end - took, end, took, line)  # its second was spread already
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
