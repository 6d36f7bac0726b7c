"""The Redis scripts against their pure models, call for call (a real redis-server)."""

from __future__ import annotations

import json
import uuid

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.limits import resty_req
from gateway.store import lua

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def client(redis_session):
    c = redis.Redis(port=redis_session.port)
    yield c
    c.close()


@pytest.fixture(scope="module")
def shas(client):
    return {
        name: client.script_load(lua.source(name)) for name in ("limit_req.lua", "limit_count.lua", "limit_conn.lua")
    }


def test_live_examples_from_the_library(client, shas):
    """reference §5.2: replies and stored states recorded from the real library's script."""
    key = f"z{uuid.uuid4().hex}:a"
    sha = shas["limit_req.lua"]
    replies = [client.evalsha(sha, 1, key, 16, 2000, now, 0) for now in ("1000000", "1000001", "1000031")]
    assert replies == [[1, 0], [1, 999], [1, 1999]]
    assert client.get(key) == b"[1999.504,1000031,0]"
    assert client.evalsha(sha, 1, key, 16, 2000, "1000100", 0) == [2, 2998]
    assert client.get(key) == b"[1999.504,1000031,0]"  # rejections are not charged
    banned = f"z{uuid.uuid4().hex}:b"
    assert client.evalsha(sha, 1, banned, 2000, 0, "1000000", 2) == [1, 0]
    assert client.evalsha(sha, 1, banned, 2000, 0, "1000200", 2) == [2, 600]
    assert client.get(banned) == b"[600,1000200,1]" and client.ttl(banned) == 2
    assert client.evalsha(sha, 1, banned, 2000, 0, "1000400", 2) == [3, 600]


calls = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=5000),  # ms since the previous call (sometimes 0)
        st.sampled_from([0, 1, 3]),  # burst
        st.sampled_from([0, 0, 2]),  # ban seconds
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rate=st.sampled_from([16, 116, 500, 1000, 2000, 100000]), steps=calls, base=st.integers(1.6e12, 1.8e12))
def test_limit_req_script_matches_the_model(client, shas, rate, steps, base):
    key = f"z{uuid.uuid4().hex}:k"
    state: resty_req.State | None = None
    now = base
    for dt, burst, ban in steps:
        now += dt
        code, excess, new_state, _ttl = resty_req.step(state, rate, burst * 1000, now, ban)
        reply = client.evalsha(shas["limit_req.lua"], 1, key, rate, burst * 1000, str(now), ban)
        assert reply == [code, resty_req.reply_integer(excess)], (dt, burst, ban)
        if new_state is not None:
            state = new_state
        stored = client.get(key)
        if state is None:
            assert stored is None
        else:
            assert json.loads(stored) == [state.excess, state.last, state.forbidden]


def test_limit_count_script(client, shas):
    key = f"c{uuid.uuid4().hex}"
    sha = shas["limit_count.lua"]
    t = 1_700_000_000_000
    assert [client.evalsha(sha, 1, key, 2, 60000, t + i) for i in range(3)] == [
        [1, 1, 60000],
        [1, 2, 59999],
        [0, 2, 59998],
    ]
    assert client.evalsha(sha, 1, key, 2, 60000, t + 60000) == [1, 1, 60000]  # a new window at the first request after


def test_limit_conn_script_leases(client, shas):
    key = f"n{uuid.uuid4().hex}"
    sha = shas["limit_conn.lua"]
    t = 1_700_000_000_000
    assert client.evalsha(sha, 1, key, 2, t, 30000, "a") == [1, 1]
    assert client.evalsha(sha, 1, key, 2, t, 30000, "b") == [1, 2]
    assert client.evalsha(sha, 1, key, 2, t, 30000, "c") == [0, 2]
    client.zrem(key, "a")
    assert client.evalsha(sha, 1, key, 2, t, 30000, "c") == [1, 2]
    # leases that ran out (a dead node's) no longer count
    assert client.evalsha(sha, 1, key, 2, t + 30001, 30000, "d") == [1, 1]


def test_limit_conn_prunes_only_when_full_and_sets_expiry_on_a_new_set(client, shas):
    key = f"n{uuid.uuid4().hex}"
    sha = shas["limit_conn.lua"]
    t = 1_700_000_000_000
    assert client.evalsha(sha, 1, key, 3, t, 30000, "a") == [1, 1]
    assert 59_000 < client.pttl(key) <= 60_000  # a new set expires after two leases
    client.pexpire(key, 45_000)
    assert client.evalsha(sha, 1, key, 3, t + 30001, 30000, "b") == [1, 2]  # not full: "a" is not looked at
    assert client.pttl(key) <= 45_000  # an existing set keeps its expiry (renewals push it)
    assert client.evalsha(sha, 1, key, 3, t + 30001, 30000, "c") == [1, 3]
    # full: the lease that ran out ("a") is dropped, and the request is let in
    assert client.evalsha(sha, 1, key, 3, t + 30001, 30000, "d") == [1, 3]
    assert client.zscore(key, "a") is None
    assert client.evalsha(sha, 1, key, 3, t + 30001, 30000, "e") == [0, 3]
