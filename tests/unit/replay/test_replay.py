"""``gateway replay``: known answers computed here, gzip, and speed (the round trip through a real
gateway is tests/e2e/test_replay_round_trip.py)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

from gateway.plan import load_config_text
from gateway.replay.logread import Timing, line_parser, read_requests
from gateway.replay.report import Report
from gateway.replay.simulate import Outcome, Simulator, context_of
from tests.support.paths import ROOT

CONFIG = """
listen: 127.0.0.1:{port}
admin: {{listen: "off"}}
log: {{access: stdout, format: '$remote_addr [$msec] "$request" $status rt=$request_time lreq=$limit_req_status'}}
upstreams: {{app: {{servers: ["{upstream}"]}}}}
zones:
  ip: {{type: req, key: $binary_remote_addr, rate: 2r/s}}
  five: {{type: req, key: $remote_addr, rate: 5r/s}}
routes:
  - {{location: /, upstream: app}}
  - {{location: /api/, upstream: app, limit_req: [{{zone: ip}}]}}
  - {{location: /burst/, upstream: app, limit_req: [{{zone: five, burst: 3, delay: 1}}]}}
"""
TEMPLATE = '$remote_addr [$msec] "$request" $status rt=$request_time lreq=$limit_req_status'


def _replay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "replay", *args], cwd=str(ROOT), capture_output=True, text=True, timeout=60
    )


def _synthetic(path: Path, t0: float = 1_790_000_000.0) -> tuple[int, int]:
    """Client A every 100 ms for 10 s, client B every second, on /api/ (2r/s, no burst); 10 on / .

    The right answer, from the leaky bucket by hand: a request passes when the bucket has drained
    a whole request (500 ms at 2r/s) since the last one that passed: A passes at 0, 500, 1000...
    (20 of 100); B always passes (10 of 10)."""
    lines = []
    for i in range(100):
        lines.append((t0 + i * 0.1, "10.0.0.1", "/api/x"))
    for i in range(10):
        lines.append((t0 + i + 0.05, "10.0.0.2", "/api/y"))
        lines.append((t0 + i + 0.07, "10.0.0.3", "/free"))
    lines.sort()
    with path.open("w") as f:
        for t, ip, uri in lines:
            f.write(f'{ip} [{t:.3f}] "GET {uri} HTTP/1.1" 200 rt=0.000 lreq=-\n')
    passed = sum(1 for i in range(100) if (i * 100) % 500 == 0) + 10
    return passed, 110 - passed


def test_synthetic_log_gives_the_answer_computed_by_hand(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    passed, rejected = _synthetic(log)
    conf = tmp_path / "limits.yaml"
    conf.write_text(CONFIG.format(port=1, upstream="127.0.0.1:9"))
    result = _replay(str(log), "-c", str(conf), "--format", TEMPLATE, "--json", "--html", str(tmp_path / "r.html"))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    ip = report["zones"]["ip"]
    assert (
        (ip["requests"], ip["passed"], ip["delayed"], ip["rejected"]) == (110, passed, 0, rejected) == (110, 30, 0, 80)
    )
    assert ip["top_limited_keys"] == [{"key": "10.0.0.1", "count": 80}]
    assert report["routes"]["/"]["requests"] == 10 and report["routes"]["/"]["rejected"] == 0
    assert report["timing"]["precise_ms"] and not report["timing"]["spread_within_second"]
    page = (tmp_path / "r.html").read_text()
    assert "<svg" in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")  # no external asset
    # the same log gzipped gives the same report
    with gzip.open(tmp_path / "access.log.gz", "wt") as f:
        f.write(log.read_text())
    gz = _replay(str(tmp_path / "access.log.gz"), "-c", str(conf), "--format", TEMPLATE, "--json")
    assert json.loads(gz.stdout)["zones"] == report["zones"]


def test_whole_second_logs_are_spread_and_the_report_says_so(tmp_path: Path) -> None:
    log = tmp_path / "combined.log"
    # 4 requests in each of 5 seconds from one client: spread to 0, 250, 500, 750 ms: at 2r/s the ones
    # at 0 and 500 pass (10), the others are rejected (10)
    with log.open("w") as f:
        for s in range(5):
            for _ in range(4):
                f.write(f'10.0.0.9 - - [23/Nov/2026:18:00:{s:02d} +0000] "GET /api/ HTTP/1.1" 200 5 "-" "ua"\n')
    conf = tmp_path / "limits.yaml"
    conf.write_text(CONFIG.format(port=1, upstream="127.0.0.1:9"))
    report = json.loads(_replay(str(log), "-c", str(conf), "--json").stdout)
    assert report["zones"]["ip"]["passed"] == 10 and report["zones"]["ip"]["rejected"] == 10
    assert report["timing"]["spread_within_second"]
    assert any("spread evenly" in n for n in report["notes"])


# /burst/ is 5r/s burst=3 delay=1 (5 milli-requests leak per ms). One request every 30 ms, then two more:
#   t:       0     30    60    90    120   150   180   210   600   610
def test_benchmark_lines_per_second(tmp_path: Path) -> None:
    n = 100_000
    lines = [
        f'10.{i % 250}.{i % 7}.1 [{1_790_000_000 + i / 1000:.3f}] "GET /api/{i % 13} HTTP/1.1" 200 rt=0.001 lreq=-\n'
        for i in range(n)
    ]
    config = load_config_text(CONFIG.format(port=1, upstream="127.0.0.1:9"))
    parse, _ = line_parser(TEMPLATE)
    timing = Timing()
    report = Report(timing=timing)
    started = time.perf_counter()
    for out in Simulator(config).run(read_requests(lines, parse, timing)):
        report.add(out)
    elapsed = time.perf_counter() - started
    rate = n / elapsed
    print(f"\nreplay: {n} lines in {elapsed:.2f} s = {rate:,.0f} lines/s")
    assert report.lines == n
    assert rate > 5_000


CONN_CONFIG = """
upstreams: {app: {servers: ["127.0.0.1:9"]}}
zones:
  c: {type: conn, key: $remote_addr}
  r: {type: req, key: $remote_addr, rate: 1r/s}
routes:
  - {location: /c/, upstream: app, limit_conn: [{zone: c, max: 1}]}
  - {location: /d/, upstream: app, limit_req: [{zone: r, burst: 5}], limit_conn: [{zone: c, max: 1}]}
"""


def _outcomes(config_text: str, lines: list[str]) -> list[Outcome]:
    parse, _ = line_parser(TEMPLATE)
    return list(Simulator(load_config_text(config_text)).run(read_requests(lines, parse, Timing())))


def _line(ip: str, end_s: float, uri: str, rt: float) -> str:
    return f'{ip} [{1_790_000_000 + end_s:.3f}] "GET {uri} HTTP/1.1" 200 rt={rt:.3f} lreq=-'


def test_limit_conn_holds_a_slot_from_start_to_logged_end() -> None:
    # A holds 0..1000 ms; B arrives at 500 (logged end 600): rejected; C at 1200: passed; another client passes
    lines = [_line("10.0.0.1", 0.6, "/c/", 0.1), _line("10.0.0.1", 1.0, "/c/", 1.0), _line("10.0.0.2", 0.7, "/c/", 0.1)]
    lines.append(_line("10.0.0.1", 1.3, "/c/", 0.1))
    got = [(o.t_ms - 1_790_000_000_000, o.limit_conn_status) for o in _outcomes(CONN_CONFIG, lines)]
    assert got == [(0, "PASSED"), (500, "REJECTED"), (600, "PASSED"), (1200, "PASSED")]


def test_a_delayed_request_takes_its_conn_slot_after_the_delay() -> None:
    # first at 0 holds its slot until 100 ms; the second, at 10 ms, is delayed 990 ms by limit_req: it asks
    # for the slot at 1000 ms, when the first is long gone (on arrival it would have been rejected)
    lines = [_line("10.0.0.1", 0.1, "/d/", 0.1), _line("10.0.0.1", 1.11, "/d/", 1.1)]
    first, second = _outcomes(CONN_CONFIG, lines)
    assert (first.limit_req_status, first.limit_conn_status) == ("PASSED", "PASSED")
    assert (second.limit_req_status, second.delay_ms, second.limit_conn_status) == ("DELAYED", 990, "PASSED")


def test_memory_stays_bounded_as_the_log_grows(tmp_path: Path) -> None:
    """Peak RSS of ``gateway replay`` on 80k and 320k lines of all-distinct clients: the zone's ``size``
    bounds the limit state (as in the gateway), the address parser's cache is capped at 65536 entries,
    top keys, timeline and reorder window are capped: four times the log, about the same memory."""
    conf = tmp_path / "limits.yaml"
    conf.write_text(CONFIG.format(port=1, upstream="127.0.0.1:9").replace("rate: 2r/s}", "rate: 2r/s, size: 64k}"))

    def peak_kb(n: int) -> int:
        log = tmp_path / f"{n}.log"
        with log.open("w") as f:
            for i in range(n):
                ip = f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"
                f.write(f'{ip} [{1_790_000_000 + i / 100:.3f}] "GET /api/ HTTP/1.1" 200 rt=0.000 lreq=-\n')
        wrapper = (
            "import resource, runpy, sys\n"
            "try:\n    runpy.run_module('gateway', run_name='__main__')\n"
            "finally:\n    print('maxrss', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
        )
        args = ["replay", str(log), "-c", str(conf), "--format", TEMPLATE, "--json"]
        result = subprocess.run(
            [sys.executable, "-c", wrapper, *args], cwd=str(ROOT), capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0 and json.loads(result.stdout)["lines"] == n, result.stderr
        return int(result.stderr.rsplit("maxrss ", 1)[1].split()[0])

    small, large = peak_kb(80_000), peak_kb(320_000)
    assert large < small * 1.25, (small, large)


def test_an_overlong_line_is_skipped_not_held(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    good = _line("10.0.0.1", 1.0, "/api/", 0.0)
    log.write_text(good + "\n" + "x" * 1_000_000 + "\n" + good.replace("10.0.0.1", "10.0.0.2") + "\n")
    conf = tmp_path / "limits.yaml"
    conf.write_text(CONFIG.format(port=1, upstream="127.0.0.1:9"))
    report = json.loads(_replay(str(log), "-c", str(conf), "--format", TEMPLATE, "--json").stdout)
    assert report["lines"] == 2 and report["timing"]["unparsed_lines"] == 1


def test_the_gateways_own_formats_are_read(tmp_path: Path) -> None:
    """combined, gateway (time_local + rt=) and json (time_iso8601) lines of the same request."""
    combined = '10.0.0.5 - - [23/Nov/2026:18:44:05 +0000] "GET /api/a?x=1 HTTP/1.1" 200 5 "-" "curl/8"'
    gateway = combined + ' rt=0.250 ua="127.0.0.1:9000" us=200 ut=0.249 lreq=PASSED lconn=- lcount=-'
    record = {
        "time_iso8601": "2026-11-23T18:44:05+00:00", "remote_addr": "10.0.0.5", "request_method": "GET",
        "request_uri": "/api/a?x=1", "status": 200, "request_time": 0.25, "limit_req_status": "PASSED",
    }  # fmt: skip
    second = 1795459445000  # 2026-11-23T18:44:05Z in ms
    for fmt, line, start in [
        ("combined", combined, second),
        ("gateway", gateway, second - 250),
        ("json", json.dumps(record), second - 250),
    ]:
        parse, _ = line_parser(fmt)
        (req,) = list(read_requests([line], parse, Timing()))
        assert req.t_ms == start, fmt
        ctx = context_of(req.fields)
        assert (ctx.client.text, ctx.method, ctx.raw_target, ctx.raw_query) == ("10.0.0.5", "GET", "/api/a?x=1", "x=1")


def test_a_truncated_gzip_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    data = gzip.compress(("\n".join(_line("10.0.0.1", i / 10, "/api/", 0.0) for i in range(5000)) + "\n").encode())
    log = tmp_path / "cut.log.gz"
    log.write_bytes(data[: len(data) // 2])
    conf = tmp_path / "limits.yaml"
    conf.write_text(CONFIG.format(port=1, upstream="127.0.0.1:9"))
    result = _replay(str(log), "-c", str(conf), "--format", TEMPLATE)
    assert result.returncode == 1 and "unreadable after" in result.stderr and "Traceback" not in result.stderr


VHOST_CONFIG = """
zones:
  a: {type: req, key: $binary_remote_addr, rate: 1r/m}
servers:
  - server_name: api.test
    routes: [{location: /, return: {code: 200, text: ok}, limit_req: [{zone: a}]}]
  - server_name: www.test
    routes: [{location: /, return: {code: 200, text: ok}}]
"""


def test_replay_picks_the_virtual_server_by_host() -> None:
    template = '$remote_addr [$msec] "$request" $status $host'
    parse, _ = line_parser(template)
    lines = [
        f'10.0.0.1 [{1_790_000_000 + i / 10:.3f}] "GET /x HTTP/1.1" 200 {host}'
        for i, host in enumerate(["api.test", "API.test", "www.test", "www.test"])
    ]
    outcomes = list(Simulator(load_config_text(VHOST_CONFIG)).run(read_requests(lines, parse, Timing())))
    # api.test's route has the 1r/m limit: its second request is over; www.test has none
    assert [o.limit_req_status for o in outcomes] == ["PASSED", "REJECTED", "", ""]
