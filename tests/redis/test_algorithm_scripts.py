"""The newer algorithms' Redis scripts, each run alone, against their pure modules call for call.

Random request sequences (hypothesis) go to the script (EVALSHA with an explicit clock)
and to the pure module; every reply and every stored state must agree exactly, floats
included (token.lua repeats token.py's double arithmetic step by step).
"""

from __future__ import annotations

import uuid

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.limits import gcra, sliding_count, sliding_log, token
from gateway.limits.params import CountParams
from gateway.store import lua

EPOCH_MS = 1_790_000_000_000
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
steps = st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 4)), min_size=1, max_size=30)


@pytest.fixture(scope="module")
def client(redis_session):
    c = redis.Redis(port=redis_session.port)
    yield c
    c.close()


@pytest.fixture(scope="module")
def shas(client):
    names = ("gcra.lua", "sliding_count.lua", "sliding_log.lua", "token.lua")
    return {name: client.script_load(lua.source(name)) for name in names}


@SETTINGS
@given(burst=st.integers(0, 20), count=st.integers(1, 50), period=st.sampled_from([1, 60, 3600]), seq=steps)
def test_gcra_script_is_cl_throttle_like_the_model(client, shas, burst, count, period, seq):
    key = f"g{uuid.uuid4().hex}"
    params = gcra.GcraParams(burst, count, period)
    now, tat = EPOCH_MS, None
    for gap, quantity in seq:
        now += gap
        step = gcra.throttle(tat, now * 1_000_000, params, quantity)
        reply = client.evalsha(shas["gcra.lua"], 1, key, now, params.emission_ns, burst, quantity)
        expected = [int(step.limited), step.limit, step.remaining, step.retry_after_s, step.reset_after_s]
        assert reply == expected
        if step.new_tat is not None:
            tat = step.new_tat
            assert client.get(key) == str(tat).encode()  # CL.THROTTLE's format, to the ns
            assert 0 < client.pttl(key) <= max(1, (tat - now * 1_000_000) // 1_000_000)


@SETTINGS
@given(limit=st.integers(1, 10), window=st.sampled_from([1000, 2500, 10_000]), seq=steps)
def test_sliding_count_script_matches_the_model(client, shas, limit, window, seq):
    key = f"s{uuid.uuid4().hex}"
    params = CountParams("z", limit, window, sliding=True)
    now, state = EPOCH_MS, None
    for gap, _ in seq:
        now += gap
        step = sliding_count.check(state, now, params)
        reply = client.evalsha(shas["sliding_count.lua"], 1, key, limit, window, now)
        assert reply == [int(step.allowed), step.remaining, step.reset_ms]
        if step.allowed:
            state = step.state


@SETTINGS
@given(limit=st.integers(1, 8), window=st.sampled_from([1000, 5000]), seq=steps)
def test_sliding_log_script_matches_the_model(client, shas, limit, window, seq):
    key = f"l{uuid.uuid4().hex}"
    params = sliding_log.LogParams(limit, window)
    now, log = EPOCH_MS, None
    for n, (gap, _) in enumerate(seq):
        now += gap
        step = sliding_log.check(log, now, params)
        reply = client.evalsha(shas["sliding_log.lua"], 1, key, now, limit, window, f"m{n}")
        retry = -(-step.retry_ms // 1000) if not step.allowed else -1
        assert reply == [int(not step.allowed), limit, step.remaining, retry, -(-step.reset_ms // 1000)]
        if step.allowed:
            log = step.state
        assert client.zcard(key) == len(sliding_log.live(log or (), now, window)) <= limit


@SETTINGS
@given(
    count=st.integers(1, 20),
    warmup=st.sampled_from([0, 500, 3000]),
    max_delay=st.sampled_from([0, 300, 2000]),
    seq=steps,
)
def test_token_script_matches_the_model_bit_for_bit(client, shas, count, warmup, max_delay, seq):
    key = f"t{uuid.uuid4().hex}"
    params = token.TokenParams.of(count, 1, warmup, max_delay)
    now, state = EPOCH_MS, None
    for gap, _ in seq:
        now += gap // 10
        step = token.acquire(state, now * 1000.0, params)
        remaining, retry, reset, delay = token.outcome_fields(step, now * 1000.0, params)
        reply = client.evalsha(
            shas["token.lua"], 1, key, now, repr(params.stable_us), repr(params.warmup_us), repr(params.max_delay_us)
        )
        assert reply == [int(not step.allowed), 0, remaining, retry, reset, delay]
        if step.allowed:
            state = step.state
            stored, next_free = (float(x) for x in client.get(key).split(b":"))
            assert (stored, next_free) == state
