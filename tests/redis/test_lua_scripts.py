"""The Redis scripts against their pure models, call for call (a real redis-server)."""

from __future__ import annotations

import json
import uuid

import pytest
import redis
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from gateway.limits import resty_req
from gateway.store import lua


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


# batch.lua: many requests in one call must decide and store exactly what one call each would.
# Two routes' fixed arguments ("plans"): limit_req with a ban, and limit_req + two limit_conn zones.
PLANS = (
    # dry, n_req, n_count, n_conn, take_conn, lease_ms, n_algo, rate_m, burst_m, delay_m, ban_s
    (0, 1, 0, 0, 0, 30000, 0, 2000, 2000, 2**53, 3),
    # ..., rate_m, burst_m, delay_m, ban_s, then the conn zones' max
    (0, 1, 0, 2, 1, 30000, 0, 1000, 3000, 1000, 0, 2, 3),
)
batch_ops = st.lists(
    st.one_of(
        st.tuples(st.just("q"), st.sampled_from([1, 2]), st.integers(0, 1), st.sampled_from([0, 0, 0, 100, 700, 1500])),
        st.tuples(st.just("x"), st.integers(0, 40)),  # give back the lease of an earlier request
    ),
    min_size=1,
    max_size=30,
)


def _run_batches(client, sha, prefix, ops, one_call_each):
    """Run ``ops`` through batch.lua as one call, or one call per operation; the replies."""
    now = 1_700_000_000_000
    taken: list[tuple[list[str], str]] = []  # (conn keys, member) of the requests so far
    calls: list[tuple[list[str], list[object], int]] = []  # per operation: keys, args, plan used
    for n, op in enumerate(ops):
        if op[0] == "q":
            _, plan, k, dt = op
            now += dt
            keys = [f"{prefix}req:k{k}"] + ([f"{prefix}c1:k{k}", f"{prefix}c2:k{k % 2}"] if plan == 2 else [])
            member = f"m{n}"
            if plan == 2:
                taken.append((keys[1:], member))
            calls.append((keys, ["q", len(keys), 4, plan, now, member, ""], plan))
        elif taken:
            keys, member = taken[op[1] % len(taken)]
            calls.append((keys, ["x", len(keys), 1, member], 0))
    if not calls:
        return []
    plan_args = [x for plan in PLANS for x in (len(plan), *plan)]
    groups = [[c] for c in calls] if one_call_each else [calls]
    replies = []
    for group in groups:
        keys = [k for c in group for k in c[0]]
        args = [x for c in group for x in c[1]]
        replies += client.evalsha(sha, len(keys), *keys, len(group), len(PLANS), *plan_args, *args)
    return replies


def _bans_within(ops):
    """Whether a key gets a fourth request within 2 s of its first (burst 2, 2 r/s): a ban starts."""
    seen: dict[int, list[int]] = {}
    now = 0
    for op in ops:
        if op[0] == "q":
            now += op[3]
            times = seen.setdefault(op[2], [])
            times.append(now)
            if len(times) >= 4 and times[-1] - times[-4] < 2000:
                return True
    return False


def _stored(client, prefix):
    out = {}
    for key in client.keys(prefix + "*"):
        name = key.decode()[len(prefix) :]
        value = client.get(key) if client.type(key) == b"string" else sorted(client.zrange(key, 0, -1))
        out[name] = (value, client.pttl(key))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=batch_ops)
@example(ops=[("q", 1, 0, 0)] * 6 + [("q", 2, 0, 0), ("q", 2, 0, 0), ("x", 1), ("q", 2, 1, 0)] * 3)
def test_a_batch_decides_and_stores_what_one_call_per_request_would(client, ops):
    """Hot keys in one batch are read once and written at the end (req_states, conn_sizes):
    the replies and what is left in Redis (values, set members, expiries) are the same as
    one call each, bans started mid-batch and releases of leases taken earlier in it included."""
    event("banned within the batch" if _bans_within(ops) else "no ban")
    sha = client.script_load(lua.source("batch.lua"))
    one, each = f"b{uuid.uuid4().hex}:", f"e{uuid.uuid4().hex}:"
    batched_replies = _run_batches(client, sha, one, ops, False)
    separate_replies = _run_batches(client, sha, each, ops, True)
    assert len(batched_replies) == len(separate_replies)
    for got, want in zip(batched_replies, separate_replies, strict=True):
        if isinstance(want, list):
            # a ban's time left (PTTL, one call each) may have lost a few ms between the calls
            assert got[:3] + got[4:] == want[:3] + want[4:]
            assert want[3] <= got[3] <= want[3] + 50
        else:
            assert got == want
    batched, separate = _stored(client, one), _stored(client, each)
    assert batched.keys() == separate.keys()
    for name, (value, pttl) in batched.items():
        assert value == separate[name][0], name
        assert abs(pttl - separate[name][1]) < 1000, name  # set in the same second, give or take
