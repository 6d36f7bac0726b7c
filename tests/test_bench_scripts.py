"""The pure parts of the benchmark scripts: open-loop percentiles and framing, Redis INFO totals."""

from __future__ import annotations

import socket
import sys

import pytest

from tests.helpers import ROOT

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
