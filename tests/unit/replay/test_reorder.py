"""``gateway replay`` on logs whose lines are out of order (merged from several nodes, or written at
request end): replayed at their own time within the reorder window, counted and reported beyond
it, with the lines held bounded by the window, not by the log."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gateway.plan import load_config_text
from gateway.replay.logread import Timing, line_parser, read_requests
from gateway.replay.report import Report
from gateway.replay.simulate import Simulator
from tests.support.paths import ROOT

TEMPLATE = '$remote_addr [$msec] "$request" $status rt=$request_time'
CONFIG = """
upstreams: {app: {servers: ["127.0.0.1:9"]}}
zones:
  ip: {type: req, key: $binary_remote_addr, rate: 5r/s}
  c: {type: conn, key: $remote_addr}
routes:
  - {location: /, upstream: app, limit_req: [{zone: ip, burst: 4, delay: 2}], limit_conn: [{zone: c, max: 2}]}
"""
T0 = 1_790_000_000


def _precise_log(seconds: int, seed: int = 7) -> list[tuple[float, str]]:
    """Three clients, one of them well over 5r/s, starting at distinct milliseconds (ties would be
    broken by log order); logged at their end, in end order: (logged time, line)."""
    rng = random.Random(seed)
    lines = []
    for start in rng.sample(range(seconds * 1000), seconds * 12):
        ip = rng.choice(("10.0.0.1", "10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.3"))
        rt = rng.randrange(0, 900)
        end = T0 + (start + rt) / 1000
        lines.append((end, f'{ip} [{end:.3f}] "GET /x/{start} HTTP/1.1" 200 rt={rt / 1000:.3f}'))
    return sorted(lines)


def _shuffled(lines: list[tuple[float, str]], spread_s: float, seed: int = 3) -> list[str]:
    """Each line moved by up to ``spread_s`` seconds either way."""
    rng = random.Random(seed)
    return [line for _, line in sorted(lines, key=lambda item: item[0] + rng.uniform(-spread_s, spread_s))]


def _replay(config_text: str, lines: list[str], template: str, window_ms: int = 120_000) -> tuple[Report, list[tuple]]:
    parse, variables = line_parser(template)
    timing = Timing(window_ms=window_ms)
    report = Report(timing=timing)
    decisions = []
    for out in Simulator(load_config_text(config_text)).run(
        read_requests(lines, parse, timing, "request_time" in variables)
    ):
        report.add(out)
        decisions.append(
            (out.t_ms, out.logged["request"], out.logged["remote_addr"], out.limit_req_status, out.delay_ms,
             out.limit_conn_status)
        )  # fmt: skip
    return report, decisions


def test_a_log_shuffled_within_a_minute_replays_as_the_sorted_log() -> None:
    log = _precise_log(300)
    ordered, in_order = _replay(CONFIG, [line for _, line in log], TEMPLATE)
    shuffled, out_of_order = _replay(CONFIG, _shuffled(log, 60), TEMPLATE)
    assert shuffled.timing.reordered > len(log) // 3 and shuffled.timing.most_out_of_order_ms > 60_000
    assert shuffled.timing.late == 0
    assert sorted(out_of_order) == sorted(in_order)
    assert shuffled.as_dict()["zones"] == ordered.as_dict()["zones"]
    ip = ordered.as_dict()["zones"]["ip"]
    assert ip["rejected"] > 100 and ip["delayed"] > 100 and ip["busiest_second"]["requests"] >= 12
    assert ordered.as_dict()["zones"]["c"]["rejected"] > 0  # slots held from start to logged end


def _whole_second_shuffle(path: Path, spread_s: float, seed: int = 5) -> list[str]:
    """A generated log's lines moved by up to ``spread_s`` seconds, each second's own lines in log
    order (the order of one second is all a whole-second log tells)."""
    rng = random.Random(seed)
    lines = path.read_text().splitlines()
    seconds = [re.search(r"\[([^]]+)\]", line).group(1) for line in lines]  # type: ignore[union-attr]
    first = {s: i for i, s in reversed(list(enumerate(seconds)))}
    jitter: dict[str, list[float]] = {}
    for s in seconds:
        jitter.setdefault(s, []).append(first[s] / 100 + rng.uniform(-spread_s, spread_s))  # --rate 100
    for values in jitter.values():
        values.sort(reverse=True)
    keys = [jitter[s].pop() for s in seconds]
    return [line for _, line in sorted(zip(keys, lines, strict=True), key=lambda item: item[0])]


def _sample(tmp_path: Path, lines: int, fmt: str) -> Path:
    path = tmp_path / f"{fmt}.log"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts/sample_access_log.py"), "--lines", str(lines), "--rate", "100",
         "--clients", "50", "--format", fmt, "-o", str(path)],
        check=True, timeout=60,
    )  # fmt: skip
    return path


def test_a_whole_second_log_shuffled_within_a_minute_replays_as_the_sorted_log(tmp_path: Path) -> None:
    """conf/limits.yaml on the generated ``gateway`` format ($time_local and $request_time)."""
    log = _sample(tmp_path, 20_000, "gateway")
    config = (ROOT / "conf/limits.yaml").read_text()
    ordered, in_order = _replay(config, log.read_text().splitlines(), "gateway")
    shuffled, out_of_order = _replay(config, _whole_second_shuffle(log, 60), "gateway")
    assert shuffled.timing.reordered > 5_000 and shuffled.timing.most_out_of_order_ms >= 60_000
    assert shuffled.timing.late == 0 and shuffled.timing.spread and shuffled.timing.starts
    assert sorted(out_of_order) == sorted(in_order)
    assert shuffled.as_dict()["zones"] == ordered.as_dict()["zones"]
    per_ip = ordered.as_dict()["zones"]["per_ip"]
    assert (
        per_ip["rejected"] > 0 and 100 <= per_ip["busiest_second"]["requests"] < 110
    )  # --rate 100, starts moved by rt


def test_lines_beyond_the_window_are_counted_and_the_busiest_second_withheld(tmp_path: Path) -> None:
    """A node's log appended 200 s late: beyond a 120 s window its lines are replayed late, counted,
    and the busiest second, which they could change, is not shown; a 300 s window takes them in."""
    rows = [(T0 + i / 10, f'10.0.0.{i % 3} [{T0 + i / 10:.3f}] "GET /a HTTP/1.1" 200 rt=0.000') for i in range(3000)]
    # a burst of 40 in one second (the true busiest), from a node whose lines come 200 s later
    burst = [f'10.0.1.{i} [{T0 + 50 + i / 100:.3f}] "GET /a HTTP/1.1" 200 rt=0.000' for i in range(40)]
    lines = [line for t, line in rows if t < T0 + 250] + burst + [line for t, line in rows if t >= T0 + 250]
    log = tmp_path / "merged.log"
    log.write_text("\n".join(lines) + "\n")
    conf = tmp_path / "limits.yaml"
    conf.write_text(CONFIG)

    def replay(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gateway", "replay", str(log), "-c", str(conf), "--format", TEMPLATE, *extra],
            cwd=str(ROOT), capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    report = json.loads(replay("--json").stdout)
    assert report["timing"]["out_of_order_beyond_window"] == 40 and report["timing"]["reorder_window_ms"] == 120_000
    assert 199_000 < report["timing"]["most_out_of_order_ms"] < 201_000  # logged 200 s after later ones
    assert (
        78_000 < report["timing"]["most_late_ms"] < 81_000
    )  # replayed at the window's edge (whole seconds), 120 s behind
    ip = report["zones"]["ip"]
    assert ip["requests"] == 3040 and ip["late"] == 40
    assert ip["busiest_second"] is None and "reorder window" in ip["busiest_second_withheld"]
    assert any("40 requests were out of order by more than the 120 s reorder window" in n for n in report["notes"])
    text = replay().stdout
    assert "zone ip: busiest second not shown: 40 of its requests" in text

    wide = json.loads(replay("--json", "--reorder-window", "5m").stdout)
    assert wide["timing"]["out_of_order_beyond_window"] == 0
    assert wide["zones"]["ip"]["busiest_second"] == {
        "unix": T0 + 50,
        "requests": 50,
    }  # the burst and that second of rows
    bad = replay("--reorder-window", "banana")
    assert bad.returncode == 2 and "invalid duration" in bad.stderr


def test_a_few_late_lines_leave_the_busiest_second_shown_with_its_margin() -> None:
    rows = [f'10.0.0.{i % 3} [{T0 + i / 10:.3f}] "GET /a HTTP/1.1" 200 rt=0.000' for i in range(3000)]
    rows.insert(2000, f'10.0.9.9 [{T0 + 10:.3f}] "GET /a HTTP/1.1" 200 rt=0.000')  # 190 s late
    report, _ = _replay(CONFIG, rows, TEMPLATE)
    ip = report.as_dict()["zones"]["ip"]
    assert report.timing.late == 1 and ip["late"] == 1
    assert ip["busiest_second"]["requests"] == 10 and ip["busiest_second_withheld"] is None
    assert "up to 1 more replayed late" in report.text()


def test_the_lines_held_are_bounded_by_the_window_not_by_the_log() -> None:
    """100 lines a second: a 10 s window holds about 1,000 lines, whether the log is 2,000 or 20,000
    lines long; whole seconds with $request_time hold two windows (seconds spread, then starts)."""

    def peak(n: int, template: str, stamp: Callable[[float], str]) -> int:
        parse, variables = line_parser(template)
        timing = Timing(window_ms=10_000)
        rng = random.Random(n)
        lines = [
            f'10.0.0.1 [{stamp(T0 + (i + rng.randrange(-300, 300)) / 100)}] "GET / HTTP/1.1" 200 rt=0.050'
            for i in range(n)
        ]  # out of order by up to 3 s
        assert sum(1 for _ in read_requests(lines, parse, timing, "request_time" in variables)) == n
        assert timing.late == 0
        return timing.held_peak

    precise = [peak(n, TEMPLATE, lambda t: f"{t:.3f}") for n in (2_000, 20_000)]
    assert precise[0] == precise[1] or abs(precise[0] - precise[1]) < 50
    assert 700 <= precise[1] <= 1_000  # the lines started within 10 s of the newest logged line
    local = '$remote_addr [$time_local] "$request" $status rt=$request_time'

    def when(t: float) -> str:
        return time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(t))

    whole = [peak(n, local, when) for n in (2_000, 20_000)]
    assert abs(whole[0] - whole[1]) < 150 and 1_400 <= whole[1] <= 2_100  # two windows and the second being read


def _combined(t: float, ip: str = "10.0.0.1") -> str:
    stamp = time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(t))
    return f'{ip} - - [{stamp}] "GET /a HTTP/1.1" 200 5 "-" "curl/8"'


def _jittered(n: int, seed: int = 11) -> list[str]:
    """``n`` combined lines, 10 a second, each logged up to 5 s from its place."""
    rng = random.Random(seed)
    keyed = sorted((T0 + i / 10 + rng.uniform(-5, 5), T0 + i / 10) for i in range(n))
    return [_combined(t) for _, t in keyed]


def _timing_of(lines: list[str], fmt: str = "combined") -> tuple[Timing, list[tuple[int, str]]]:
    """The timing, and each request's (second replayed at, client) in replay order."""
    parse, variables = line_parser(fmt)
    timing = Timing()
    out = [(r.t_ms, r.fields["remote_addr"]) for r in read_requests(lines, parse, timing, "request_time" in variables)]
    assert len(out) == len(lines) and out == sorted(out, key=lambda r: r[0])
    return timing, [(t // 1000, ip) for t, ip in out]


def test_one_line_a_day_ahead_does_not_make_the_rest_of_the_log_late() -> None:
    """A merged log with one line from a node whose clock is a day ahead: the log's clock stays
    with the others, so the jitter is still put back in order; the outlier is counted, by line."""
    lines = _jittered(2_000)
    plain, starts = _timing_of(lines)
    assert plain.late == 0 and plain.reordered > 100 and plain.outliers == 0
    lines.insert(700, _combined(T0 + 86_400 + 70, ip="10.0.9.9"))
    timing, with_outlier = _timing_of(lines)
    assert timing.late == 0 and timing.reordered == plain.reordered
    assert timing.outliers == 1 and timing.outlier_lines == [701] and 86_300_000 < timing.most_ahead_ms < 86_401_000
    outlier = next(r for r in with_outlier if r[1] == "10.0.9.9")
    assert T0 + 60 < outlier[0] < T0 + 80  # at the log's time when it was found out, not a day later
    with_outlier.remove(outlier)
    assert with_outlier == starts
    # the same line first: it does not set the clock either
    first, _ = _timing_of([_combined(T0 + 86_400, ip="10.0.9.9"), *_jittered(2_000)])
    assert first.late == 0 and first.outliers == 1 and first.outlier_lines == [1]


def test_a_log_that_really_moves_on_moves_the_clock() -> None:
    """An hour without requests, then more: the lines after the gap agree, the clock goes there,
    and a straggler from before the gap is late, as before; lines far ahead at the very end are
    replayed at their own time (nothing follows that they could make late)."""
    before = [_combined(T0 + i / 10) for i in range(600)]
    after = [_combined(T0 + 3_600 + i / 10) for i in range(600)]
    timing, starts = _timing_of([*before, *after[:5], _combined(T0 + 59), *after[5:], _combined(T0 + 90_000)])
    assert timing.outliers == 0 and timing.late == 1
    assert starts[-1][0] == T0 + 90_000
    held = Timing(window_ms=10_000)
    parse, _ = line_parser("combined")
    for _ in read_requests([*before, *after], parse, held, False):
        pass
    assert held.held_peak < 150  # bounded by the window (10 a second), across the jump too


def test_the_report_names_the_outlier_and_a_window_past_an_hour_is_refused(tmp_path: Path) -> None:
    lines = _jittered(300)
    lines.insert(100, _combined(T0 + 86_400, ip="10.0.9.9"))
    (tmp_path / "a.log").write_text("\n".join(lines) + "\n")
    (tmp_path / "limits.yaml").write_text(CONFIG)

    def replay(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gateway", "replay", str(tmp_path / "a.log"), "-c", str(tmp_path / "limits.yaml"),
             *extra],
            cwd=str(ROOT), capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    report = json.loads(replay("--json").stdout)
    assert report["timing"]["ahead_outliers"] == 1 and report["timing"]["ahead_outlier_lines"] == [101]
    assert report["timing"]["out_of_order_beyond_window"] == 0
    assert any("ahead of the log's time" in n and "(line 101)" in n for n in report["notes"])
    assert replay("--reorder-window", "1h").returncode == 0
    out = replay("--reorder-window", "1d")
    assert out.returncode == 2 and "at most 1h" in out.stderr
