"""The pure parts of the benchmark scripts: open-loop percentiles and framing, Redis INFO totals."""

from __future__ import annotations

import socket
import sys

import pytest

from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

import bench
import openloop


def test_nearest_rank_percentiles():
    values = [float(v) for v in range(1, 101)]  # 1 .. 100
    assert openloop.percentile(values, 50) == 50
    assert openloop.percentile(values, 99) == 99
    assert openloop.percentile(values, 99.9) == 100
    assert openloop.percentile(values, 100) == 100
    assert openloop.percentile(values, 0) == 1
    assert openloop.percentile([7.0], 99) == 7
    # 10 values: p99 is the largest, p90 the ninth; a slow tail is never averaged away
    tail = [1.0] * 9 + [500.0]
    assert openloop.percentile(tail, 90) == 1
    assert openloop.percentile(tail, 99) == 500
    assert openloop.percentile([], 50) != openloop.percentile([], 50)  # nan


def test_response_length_waits_for_the_whole_body():
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\n"
    assert openloop.response_length(head) == 0
    assert openloop.response_length(head + b"ok") == 0
    assert openloop.response_length(head + b"ok\n") == len(head) + 3
    # a pipelined second response is left for the next call
    assert openloop.response_length(head + b"ok\nHTTP/1.1 204") == len(head) + 3
    no_body = b"HTTP/1.1 204 No Content\r\nServer: x\r\n\r\n"
    assert openloop.response_length(no_body) == len(no_body)
    assert openloop.response_length(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n") == 38


def redis_call(port: int, *args: str) -> bytes:
    payload = f"*{len(args)}\r\n" + "".join(f"${len(a)}\r\n{a}\r\n" for a in args)
    with socket.create_connection(("127.0.0.1", port), 5) as s:
        s.sendall(payload.encode())
        return s.recv(65536)


def test_redis_snapshot_counts_scripts_and_inner_commands(redis_server):
    redis = bench.Redis(None, redis_server.port)
    before = redis.snapshot()
    script = "redis.call('SET', KEYS[1], '1'); return redis.call('INCR', KEYS[1])"
    for _ in range(3):
        assert redis_call(redis_server.port, "EVAL", script, "1", "k").startswith(b":")
    assert redis_call(redis_server.port, "GET", "k") == b"$1\r\n2\r\n"
    after = redis.snapshot()
    assert after.script_calls - before.script_calls == 3
    # 3 EVAL + 3 SET + 3 INCR inside them + 1 GET; the INFO calls of the snapshots are left out
    assert after.commands - before.commands == 10
    assert after.cpu_seconds >= before.cpu_seconds > 0


def test_parse_info_skips_headers_and_blanks():
    text = "# CPU\r\nused_cpu_sys:0.5\r\nused_cpu_user:1.25\r\n\r\n# Commandstats\r\ncmdstat_get:calls=2,usec=3\r\n"
    assert bench.parse_info(text) == {"used_cpu_sys": "0.5", "used_cpu_user": "1.25", "cmdstat_get": "calls=2,usec=3"}
    snap = bench.redis_snapshot(
        "cmdstat_evalsha:calls=4,usec=9,usec_per_call=2.25\r\ncmdstat_info:calls=7,usec=1", text
    )
    assert snap == bench.RedisSnapshot(script_calls=4, commands=4, cpu_seconds=pytest.approx(1.75))


@pytest.mark.parametrize("script", sorted(p.stem for p in (ROOT / "scripts").glob("*.py")))
def test_every_script_imports(script):
    """A script that imports a helper bench.py no longer has fails only when someone runs it:
    bench_instructions.py and bench_scrape.py did. Importing runs none of their main()."""
    __import__(script)


def test_the_open_loop_generator_sleeps_a_timer_tick_at_least_and_keeps_its_rate(monkeypatch):
    """libuv's timers count whole milliseconds: a shorter sleep returns at once, so a generator
    that asked for one spun, took the CPU it shares with the upstream, and its own lateness
    read as proxy latency. Every pause it asks for is a tick or more, and it keeps its rate."""
    import asyncio
    import contextlib
    import threading

    async def serve(ready: threading.Event, stop: threading.Event, port_box: list[int]) -> None:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                    while await reader.readuntil(b"\r\n\r\n"):
                        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            finally:
                writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port_box.append(server.sockets[0].getsockname()[1])
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        server.close()
        await server.wait_closed()

    ready, stop, port_box = threading.Event(), threading.Event(), []
    thread = threading.Thread(target=lambda: asyncio.run(serve(ready, stop, port_box)), daemon=True)
    thread.start()
    assert ready.wait(10)
    generator_thread = threading.get_ident()
    pauses: list[float] = []
    real_sleep = asyncio.sleep

    def sleep(delay: float, *args: object) -> object:
        if threading.get_ident() == generator_thread:
            pauses.append(delay)
        return real_sleep(delay, *args)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    try:
        result = openloop.run(f"http://127.0.0.1:{port_box[0]}/", rate=3000, seconds=1, connections=8)
    finally:
        stop.set()
        thread.join(10)
    assert result.errors == 0 and result.unanswered == 0
    assert result.statuses == {200: 3000} and len(result.latencies) == result.scheduled == 3000
    assert pauses and min(pauses) >= openloop.TIMER_TICK_S == 0.001
    # at 3,000/s three requests fall due per tick: they go out together, a tick apart
    assert len(pauses) < 1500
    assert openloop.percentile(sorted(result.timer_lag), 50) < 0.005


def test_tree_b_targets_run_from_that_checkout_and_a_tree_without_the_package_is_refused(tmp_path, monkeypatch):
    """--tree-b: an A/B of two checkouts in the same rounds. The @B twin imports the other
    tree's gateway package (its working directory), on the same interpreter."""
    monkeypatch.setattr(bench, "TREE_B", [tmp_path])
    assert bench.tree_for("gateway+redis@B") == tmp_path
    assert bench.tree_for("gateway+redis") == bench.ROOT
    assert bench.python_for("gateway+redis@B") == bench.PY
    monkeypatch.setattr(sys, "argv", ["bench.py", "--tree-b", str(tmp_path), "--targets", "gateway@B"])
    with pytest.raises(SystemExit, match="no gateway package there"):
        bench.main()
