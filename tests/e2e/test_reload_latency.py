"""A reload parses and compiles off the event loop: requests keep being answered meanwhile.

The gateway runs through its CLI with 2000 locations (1500 prefix, 500 regex)
and several zones. A probe sends a request over one keep-alive connection every
few milliseconds and times each answer; the gateway answers it itself (a
``limit_req`` rejection), so the probe measures the serving loop and nothing
else. The reload changes the rejection status (429 -> 503): the first 503 is the
moment the new configuration took effect.
"""

from __future__ import annotations

import asyncio
import gc
import http.client
import signal
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gateway.config.teardown import release
from gateway.errors import ConfigErrors
from gateway.plan import load_config_text
from gateway.plan.compiled import CompiledConfig
from gateway.runtime.offloop import load_config_off_loop, release_off_loop
from tests.support.gateway import Gateway
from tests.support.upstreams import Upstream

WORST_ALLOWED_S = 0.050  # on top of the machine's own noise; the aim is 10 ms, the margin is for CI
WORKERS_WORST_ALLOWED_S = 0.250
# A loop that parses on itself stalls for the whole parse. The clock that tells a stall from a busy
# machine is the reload's own duration: on a machine busy enough to slow every answer, the parse is
# slowed alike. So a probe answer may take at most WORST_ALLOWED_S over the noise measured before,
# or, on a machine too busy for that, a quarter of the time the reload took: either way the loop
# kept answering while the configuration was parsed.
STALL_FRACTION = 0.25
BASELINE_S = 1.0  # how long the probe runs before the reload to measure that noise
PREFIX_ROUTES = 1500
REGEX_ROUTES = 500
RELEASE_S = 0.5  # how long after the swap the probe keeps counting

ALIAS_BOMB_6 = """\
a: &a ["x","x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]
routes: *f
"""


def large_config(port: int, upstream: str, probe_status: int) -> str:
    lines = [
        f"listen: 127.0.0.1:{port}",
        "shutdown_timeout: 2s",
        "log: {access: off}",
        "upstreams:",
        f"  app: {{servers: [{upstream}]}}",
        "zones:",
        "  probe: {type: req, key: $binary_remote_addr, rate: 1r/m}",
    ]
    lines += [f"  z{i}: {{type: req, key: $binary_remote_addr$uri, rate: {10 + i}r/s}}" for i in range(6)]
    lines += ["  quota: {type: count, key: $binary_remote_addr, limit: 1000, window: 1m}"]
    lines += ["  conns: {type: conn, key: $binary_remote_addr}"]
    lines += [
        "routes:",
        "  - location: /probe/",
        "    upstream: app",
        "    limit_req: [{zone: probe}]",
        f"    limit_req_status: {probe_status}",
    ]
    for i in range(PREFIX_ROUTES):
        lines += [
            f"  - location: /p{i}/",
            "    upstream: app",
            f"    limit_req: [{{zone: z{i % 6}, burst: 5}}]",
            "    limit_count: [{zone: quota}]" if i % 3 == 0 else "    limit_conn: [{zone: conns, max: 10}]",
        ]
    for i in range(REGEX_ROUTES):
        lines += [
            f"  - location: ~ ^/r{i}/(a|b)+/[0-9]+$",
            "    upstream: app",
            f"    limit_req: [{{zone: z{i % 6}, burst: 5, nodelay: true}}]",
        ]
    return "\n".join(lines) + "\n"


@dataclass
class Probe:
    """Requests over one keep-alive connection, paced a few ms apart, each timed."""

    port: int
    samples: list[tuple[float, float, int]] = field(default_factory=list)  # (sent, seconds, status)
    warm: threading.Event = field(default_factory=threading.Event)
    saw_503: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    failure: list[BaseException] = field(default_factory=list)

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            while not self.stop.is_set():
                sent = time.perf_counter()
                conn.request("GET", "/probe/x")
                response = conn.getresponse()
                response.read()
                self.samples.append((sent, time.perf_counter() - sent, response.status))
                if len(self.samples) >= 50:
                    self.warm.set()
                if response.status == 503:
                    self.saw_503.set()
                self.stop.wait(0.003)  # pacing, not waiting for anything
        except BaseException as exc:  # reported by the test
            self.failure.append(exc)
            self.warm.set()
            self.saw_503.set()
        finally:
            conn.close()

    def worst(self, start: float, end: float) -> tuple[float, int]:
        window = [took for sent, took, _ in self.samples if start <= sent <= end]
        return max(window, default=0.0), len(window)

    def wait_past(self, moment: float) -> None:
        """Until a request sent after ``moment`` has been answered."""
        deadline = time.monotonic() + 20
        while not (self.samples and self.samples[-1][0] > moment):
            assert time.monotonic() < deadline and not self.failure, self.failure
            time.sleep(0.003)


def _wait_for_log(gw: Gateway, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in gw.stderr():
        assert time.monotonic() < deadline, f"no {text!r} in the error log:\n{gw.stderr()}"
        time.sleep(0.005)


@pytest.mark.timing
def test_a_reload_of_2000_locations_does_not_stall_serving(gateway_factory, upstream: Upstream):
    gw = gateway_factory(lambda port: large_config(port, upstream.address, 429))
    probe = Probe(gw.port)
    thread = threading.Thread(target=probe.run, daemon=True)
    gc.disable()  # a full collection in this (large) test process would stall the probe, not the gateway
    thread.start()
    try:
        assert probe.warm.wait(20) and not probe.failure, probe.failure
        probe.wait_past(time.perf_counter() + BASELINE_S)  # this machine's own noise, without a reload
        baseline, _ = probe.worst(0, time.perf_counter())
        assert {status for _, _, status in probe.samples[1:]} == {429}

        gw.write_config(large_config(gw.port, upstream.address, 503))
        started = time.perf_counter()
        gw.signal(signal.SIGHUP)
        assert probe.saw_503.wait(30) and not probe.failure, probe.failure
        applied = next(sent + took for sent, took, status in probe.samples if status == 503)
        probe.wait_past(applied + RELEASE_S)  # the replaced configuration is freed after the swap
        worst, count = probe.worst(started, applied + RELEASE_S)
        print(
            f"\nreload of {PREFIX_ROUTES + REGEX_ROUTES} locations took {applied - started:.3f}s; "
            f"worst probe latency until {RELEASE_S}s later {worst * 1000:.1f} ms over {count} requests "
            f"(before the reload: {baseline * 1000:.1f} ms)"
        )
        assert count >= 10  # the probe really ran while the reload did
        assert worst < max(WORST_ALLOWED_S + baseline, STALL_FRACTION * (applied - started)), (worst, baseline)

        # A 6-level alias bomb through reload: refused at once, the old configuration keeps serving.
        Path(gw.config_path).write_text(ALIAS_BOMB_6)
        bombed = time.perf_counter()
        gw.signal(signal.SIGHUP)
        _wait_for_log(gw, "expands to more than 100000 values", timeout=10)
        refused = time.perf_counter()
        bomb_worst, bomb_count = probe.worst(bombed, refused)
        after = len(probe.samples)
        probe.wait_past(refused)
        print(
            f"alias bomb refused after {refused - bombed:.3f}s; "
            f"worst probe latency meanwhile {bomb_worst * 1000:.1f} ms over {bomb_count} requests"
        )
        assert refused - bombed < 2.0
        assert bomb_worst < max(WORST_ALLOWED_S + baseline, STALL_FRACTION * (refused - bombed)), bomb_worst
        assert {status for _, _, status in probe.samples[after:]} == {503}
        assert "limits.yaml:5:29: (top level): the document expands to more than 100000 values" in gw.stderr()
    finally:
        probe.stop.set()
        thread.join(15)
        gc.enable()


@pytest.mark.timing
def test_with_workers_the_master_parses_off_its_loop_and_refuses_a_bomb(gateway_factory, upstream: Upstream):
    def config(port: int, status: int) -> str:
        return large_config(port, upstream.address, status).replace(
            "shutdown_timeout:", "workers: 2\nshutdown_timeout:"
        )

    gw = gateway_factory(lambda port: config(port, 429))
    _wait_for_log(gw, "listening on", timeout=20)
    probe = Probe(gw.port)
    thread = threading.Thread(target=probe.run, daemon=True)
    gc.disable()
    thread.start()
    try:
        assert probe.warm.wait(20) and not probe.failure, probe.failure
        probe.wait_past(time.perf_counter() + BASELINE_S)
        baseline, _ = probe.worst(0, time.perf_counter())
        gw.write_config(config(gw.port, 503))
        started = time.perf_counter()
        gw.signal(signal.SIGHUP)  # the master parses, then signals each worker to reload
        assert probe.saw_503.wait(30) and not probe.failure, probe.failure
        applied = next(sent + took for sent, took, status in probe.samples if status == 503)
        probe.wait_past(applied + RELEASE_S)
        worst, count = probe.worst(started, applied + RELEASE_S)
        print(
            f"\nworkers: 2: reload took {applied - started:.3f}s; worst probe latency {worst * 1000:.1f} ms "
            f"(before the reload: {baseline * 1000:.1f} ms)"
        )
        assert count >= 10
        # Three processes parse at once on a shared machine: CPU contention, spread over the reload,
        # not a stalled loop (the old code stalled the serving loop for the whole parse).
        assert worst < max(WORKERS_WORST_ALLOWED_S + baseline, STALL_FRACTION * (applied - started)), (worst, baseline)

        Path(gw.config_path).write_text(ALIAS_BOMB_6)
        bombed = time.perf_counter()
        gw.signal(signal.SIGHUP)
        _wait_for_log(gw, "expands to more than 100000 values", timeout=10)
        assert time.perf_counter() - bombed < 2.0
        after = len(probe.samples)
        probe.wait_past(time.perf_counter())
        assert {status for _, _, status in probe.samples[after:]} == {503}
        assert gw.stderr().count("expands to more than 100000 values") == 1  # the master only: no worker reloaded
    finally:
        probe.stop.set()
        thread.join(15)
        gc.enable()


async def test_overlapping_loads_restore_the_switch_interval_and_the_collector(tmp_path: Path):
    good = tmp_path / "good.yaml"
    good.write_text(large_config(8080, "127.0.0.1:9", 429))
    bad = tmp_path / "bad.yaml"
    bad.write_text(ALIAS_BOMB_6)
    before = sys.getswitchinterval()
    assert gc.isenabled()
    results = await asyncio.gather(
        load_config_off_loop(str(good)),
        load_config_off_loop(str(bad)),
        release_off_loop([large_config(1, "x", 1)]),
        return_exceptions=True,
    )
    assert isinstance(results[0], CompiledConfig)
    assert len(results[0].routes) == 1 + PREFIX_ROUTES + REGEX_ROUTES
    assert isinstance(results[1], ConfigErrors)
    assert sys.getswitchinterval() == before
    assert gc.isenabled()


def test_a_reload_off_the_loop_keeps_the_command_line_overrides(gateway_factory, upstream: Upstream):
    def config(port: int, status: int) -> str:
        return large_config(port, "127.0.0.1:9", status)  # nothing listens on :9: only the override works

    gw = gateway_factory(lambda port: config(port, 429), extra_args=("--upstream", f"app={upstream.address}"))
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    try:
        conn.request("GET", "/p7/echo")
        response = conn.getresponse()
        response.read()
        assert (response.status, len(upstream.seen)) == (200, 1)
        gw.write_config(config(gw.port, 503))
        gw.signal(signal.SIGHUP)
        _wait_for_log(gw, "configuration reloaded", timeout=20)
        conn.request("GET", "/p8/echo")
        response = conn.getresponse()
        response.read()
        assert (response.status, len(upstream.seen)) == (200, 2)
    finally:
        conn.close()


def test_release_frees_the_whole_tree_and_empties_the_holder():
    class Sentinel:
        pass

    sentinel = Sentinel()
    alive = weakref.ref(sentinel)
    shared = [sentinel]
    tree = {"routes": [{"n": i, "deep": [[shared]], "both": (shared, {i})} for i in range(1000)]}
    holder: list[object] = [tree, load_config_text(large_config(8080, "127.0.0.1:9", 429))]
    del sentinel, shared, tree
    release(holder)
    assert holder == [] and alive() is None
