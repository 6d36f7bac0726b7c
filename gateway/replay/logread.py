"""Access log lines to timed requests, streamed: nginx ``combined``, the gateway's formats, a template.

Times: ``$msec`` gives milliseconds. Without it only whole seconds are known
(``$time_local``, ``$time_iso8601``): the requests of one second are spread evenly
across it, and ``Timing.spread`` says so. nginx and the gateway log a request when
it ends; when ``$request_time`` is there the request is placed at its start
(end - request_time). Requests are then put back in start order within a bounded
window (the longest ``$request_time`` seen + 1 s, at most ``REORDER_MS``); one that
starts even earlier is counted in ``Timing.late``.
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

REORDER_MS = 60_000
MAX_LINE = 64 * 1024  # longer lines are skipped (counted as unparsed), never held whole
LineParser = Callable[[str], dict[str, str] | None]


@dataclass(slots=True)
class Timing:
    precise: bool = False  # $msec was in the format
    spread: bool = False  # whole seconds only: spread evenly
    starts: bool = False  # $request_time moved requests to their start
    late: int = 0  # started before an already replayed request, beyond the reorder window
    unparsed: int = 0
    first_unparsed: str = ""


@dataclass(slots=True)
class LogRequest:
    t_ms: int  # start (estimated), on the log's clock
    end_ms: int  # as logged
    fields: dict[str, str]


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


def read_requests(lines: Iterable[str], parse: LineParser, timing: Timing) -> Iterator[LogRequest]:
    """Parsed, timed requests in start order (streamed; memory bounded by one second and the window)."""
    return _reorder(_spread(_timed(lines, parse, timing), timing), timing)


def _timed(lines: Iterable[str], parse: LineParser, timing: Timing) -> Iterator[tuple[int, bool, dict[str, str]]]:
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
        yield end[0], end[1], fields


def _spread(items: Iterator[tuple[int, bool, dict[str, str]]], timing: Timing) -> Iterator[tuple[int, dict[str, str]]]:
    second = -1
    group: list[dict[str, str]] = []
    for end, precise, fields in items:
        if precise:
            timing.precise = True
            yield end, fields
            continue
        timing.spread = True
        if end != second and group:
            yield from _even(second, group)
            group = []
        second = end
        group.append(fields)
    if group:
        yield from _even(second, group)


def _even(second_ms: int, group: list[dict[str, str]]) -> Iterator[tuple[int, dict[str, str]]]:
    n = len(group)
    for i, fields in enumerate(group):
        yield second_ms + i * 1000 // n, fields


def _reorder(items: Iterator[tuple[int, dict[str, str]]], timing: Timing) -> Iterator[LogRequest]:
    heap: list[tuple[int, int, LogRequest]] = []  # (start, line number, request): ties keep log order
    newest = 0
    window = 1000  # grows with the longest $request_time seen, up to REORDER_MS
    last = -(2**62)
    for seq, (end, fields) in enumerate(items):
        took = _request_ms(fields)
        if took:
            timing.starts = True
            window = min(REORDER_MS, max(window, took + 1000))
        newest = max(newest, end)
        heapq.heappush(heap, (end - took, seq, LogRequest(end - took, end, fields)))
        while heap and heap[0][0] <= newest - window:
            out = heapq.heappop(heap)[2]
            last = _clamp(out, last, timing)
            yield out
    while heap:
        out = heapq.heappop(heap)[2]
        last = _clamp(out, last, timing)
        yield out


def _clamp(req: LogRequest, last: int, timing: Timing) -> int:
    if req.t_ms < last:
        timing.late += 1
        req.t_ms = last
    return req.t_ms
