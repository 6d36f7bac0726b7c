"""``gateway replay <access.log> -c limits.yaml [--format F] [--reorder-window 120s] [--json] [--html FILE]``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator

from gateway.plan import load_config
from gateway.replay.logread import DEFAULT_WINDOW_MS, Timing, line_parser, lines_of, open_log, read_requests
from gateway.replay.report import Report
from gateway.replay.simulate import Outcome, Simulator


def run_replay(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    parse, variables = line_parser(args.format)
    timing = Timing(window_ms=getattr(args, "reorder_window", None) or DEFAULT_WINDOW_MS)
    report = Report(
        timing=timing,
        binary_zones=frozenset(n for n, z in config.spec.zones.items() if "binary_remote_addr" in z.key.variables),
    )
    for name, zone in config.spec.zones.items():
        missing = [v for v in zone.key.variables if not _logged(v, variables)]
        if missing:
            report.notes.append(
                f'zone "{name}": its key uses ${missing[0]}, which the log format lacks: '
                "its key is empty and the zone is skipped, as for a request without it"
            )
    try:
        stream = open_log(args.access_log)
    except OSError as exc:
        print(f"gateway: {args.access_log}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    simulator = Simulator(config)
    try:
        with stream:
            outcomes = simulator.run(read_requests(lines_of(stream), parse, timing, "request_time" in variables))
            for out in _progress(outcomes, args.access_log):
                report.add(out)
    except (OSError, EOFError) as exc:  # a truncated or corrupt gzip stream
        print(f"gateway: {args.access_log}: unreadable after {report.lines} requests: {exc}", file=sys.stderr)
        return 1
    _timing_notes(report, timing)
    if args.html:
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(report.html())
    sys.stdout.write(json.dumps(report.as_dict(), indent=2) + "\n" if args.json else report.text())
    return 0


def _logged(variable: str, variables: set[str]) -> bool:
    if variable in ("binary_remote_addr", "remote_addr"):
        return "remote_addr" in variables
    if variable in ("uri", "request_uri") or variable.startswith("arg_"):
        return bool({"request", "request_uri", "uri"} & variables)
    if variable == "request_method":
        return bool({"request", "request_method"} & variables)
    if variable == "host":
        return bool({"host", "http_host"} & variables)
    if variable.startswith("cookie_"):
        return "http_cookie" in variables
    return variable in variables


def _timing_notes(report: Report, timing: Timing) -> None:
    if timing.spread:
        report.notes.append(
            "the log has whole seconds only (no $msec): each second's requests were spread evenly across it, "
            "so decisions within a second are an estimate"
        )
    if timing.starts:
        report.notes.append("requests were placed at their start ($msec or the second, minus $request_time)")
    else:
        report.notes.append("no $request_time: limit_conn slots are released at once (concurrency is not known)")
    window = f"{timing.window_ms / 1000:g} s"
    if timing.reordered:
        report.notes.append(
            f"{timing.reordered} lines were logged after later ones (by up to {timing.most_out_of_order_ms / 1000:g} s)"
            f" and were put back in order within the {window} reorder window"
        )
    if timing.late:
        why = f", {timing.late_long} of them because their $request_time is longer" if timing.late_long else ""
        report.notes.append(
            f"{timing.late} requests were out of order by more than the {window} reorder window{why}: they were "
            f"replayed up to {timing.latest_ms / 1000:g} s after their time (raise --reorder-window)"
        )
    if timing.outliers:
        more = ", ..." if timing.outliers > len(timing.outlier_lines) else ""
        at = ", ".join(str(n) for n in timing.outlier_lines) + more
        report.notes.append(
            f"{timing.outliers} lines were more than the {window} reorder window ahead of the log's time (up to "
            f"{timing.most_ahead_ms / 1000:g} s), and no others followed them there (line {at}): a clock set wrong, "
            "they were replayed at the log's time when they were read, not at their own"
        )
    if timing.unparsed:
        report.notes.append(f"{timing.unparsed} lines did not match the format, e.g. {timing.first_unparsed[:120]!r}")


def _progress(outcomes: Iterator[Outcome], path: str) -> Iterator[Outcome]:
    """A progress line on a terminal (stderr), nothing otherwise."""
    if not sys.stderr.isatty():
        yield from outcomes
        return
    started = last = time.monotonic()
    n = 0
    for out in outcomes:
        n += 1
        yield out
        if n % 4096 == 0 and time.monotonic() - last > 0.25:
            last = time.monotonic()
            rate = n / max(last - started, 1e-9)
            sys.stderr.write(f"\r{path}: {n:,} lines, {rate:,.0f} lines/s")
            sys.stderr.flush()
    sys.stderr.write(f"\r{n:,} lines in {time.monotonic() - started:.1f} s\n")
