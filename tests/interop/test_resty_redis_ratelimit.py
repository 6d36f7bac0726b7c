"""Interop with OpenResty nodes running lua-resty-redis-ratelimit's protocol (see openresty.py).

An nginx + ngx_http_lua node loads scripts/lua/limit_req.lua and calls it exactly as the
library does (``EVALSHA <sha> 1 <zone>:<key> <rate_m> <burst_m> <now> <duration>``); the
gateway shares the same Redis keys. After every request the stored ``[excess, last,
forbidden]`` is read back and compared with the library's float formula
(shared/reference/limit-semantics.md §5.2) applied to the previous stored state, whichever
side wrote it.

The delay grid (``test_delays_agree_to_the_millisecond``) drives the shared state by timestamps
on both sides: the gateway's Redis store runs in this process on a fake clock, the node takes
the same ``now`` as an argument, and both start each request from the same stored value.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import time
import uuid
from collections.abc import Callable

import pytest

from gateway.config.store import RedisSpec
from gateway.limits import resty_req
from gateway.store.redis import RedisStore
from tests.support.conformance import T0, FakeClock, Scenario, config
from tests.support.gateway import Gateway
from tests.support.openresty import ZONES, Hit, Monitor, OpenResty, epoch_ms, http_get, script_path
from tests.support.redis_procs import RedisServer

CLIENT = b"\x7f\x00\x00\x01"  # $binary_remote_addr of 127.0.0.1, on both nodes
SLACK_MS = 5.0  # a node's clock reading vs the test's clock around the request
NUMBER = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
LIBRARY_STATE = re.compile(rf"\[({NUMBER}),({NUMBER}),([01])\]")  # cjson: no spaces


def rkey(zone: str, key: bytes = CLIENT) -> bytes:
    return zone.encode() + b":" + key


def leak(excess: float, last: float, now: float, rate_m: int) -> float:
    """The library's arithmetic for one more request (§5.2), in floating point."""
    return max(0.0, excess - rate_m * abs(now - last) / 1000 + 1000)


def leak_range(excess: float, last: float, lo: float, hi: float, rate_m: int) -> tuple[float, float]:
    """Smallest and largest value of ``leak`` for a clock reading anywhere in [lo, hi]."""
    values = [leak(excess, last, lo, rate_m), leak(excess, last, hi, rate_m)]
    if lo <= last <= hi:
        values.append(leak(excess, last, last, rate_m))
    return min(values), max(values)


def parse_state(raw: str) -> tuple[float, float, int]:
    match = LIBRARY_STATE.fullmatch(raw)
    assert match, f"stored value {raw!r} is not the library's [excess,last,forbidden]"
    value = json.loads(raw)
    assert isinstance(value, list) and len(value) == 3
    return float(value[0]), float(value[1]), int(value[2])


class GatewayClient:
    """Requests to the gateway, tagged so their access log lines can be found."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.expected: dict[str, str] = {}

    def get(self, zone: str) -> Hit:
        rid = uuid.uuid4().hex[:12]
        hit = http_get(self.gw.port, f"{ZONES[zone][1]}?rid={rid}")
        hit.headers["x-rid"] = rid
        if hit.status in (200, 503):
            self.expected[rid] = "PASSED" if hit.status == 200 else "REJECTED"
        return hit

    def check_log(self) -> None:
        """Every 503 was a limit_req rejection (not on_error=deny), every 200 a PASSED."""
        seen: dict[str, str] = {}
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            for entry in self.gw.access_json(wait=0.15):
                uri = str(entry.get("request_uri", ""))
                if "rid=" in uri:
                    seen[uri.rsplit("rid=", 1)[1]] = str(entry.get("limit_req_status"))
            if all(rid in seen for rid in self.expected):
                break
        assert {rid: seen.get(rid) for rid in self.expected} == self.expected
        stderr = self.gw.stderr()
        for marker in ("Traceback", "Redis error", "Redis unavailable", "circuit open"):
            assert marker not in stderr, f"gateway error log mentions {marker!r}:\n{stderr[-3000:]}"


class Bucket:
    """One shared key, predicted from its stored state and checked after every request.

    ``check`` is called right after each request (nothing else touches the key in between).
    """

    def __init__(self, redis: RedisServer, zone: str, rate_m: int, burst_m: int, duration: int = 0,
                 key: bytes = CLIENT) -> None:  # fmt: skip
        self.redis = redis
        self.key = rkey(zone, key)
        self.rate_m = rate_m
        self.burst_m = burst_m
        self.duration = duration
        self.raw: str | None = None
        self.excess = 0.0
        self.last = 0.0
        self.banned = False
        self.writes: list[tuple[str, str]] = []  # (side, stored value) after each write

    def reset(self) -> None:
        self.redis.command("DEL", self.key)
        self.raw = None
        self.banned = False

    def stored(self) -> tuple[str | None, int]:
        return self.redis.command("GET", self.key), int(self.redis.command("PTTL", self.key))

    def check(self, hit: Hit, side: str) -> None:
        raw, pttl = self.stored()
        lo, hi = hit.t_before - SLACK_MS, hit.t_after + SLACK_MS
        what = f"{side} request answered {hit.status} {hit.headers.get('x-err', '')}; stored {raw!r} (was {self.raw!r})"
        if hit.status == 500 or (side == "openresty" and hit.state is None):
            pytest.fail(f"{what}: {hit.body}")
        if self.banned:
            assert hit.status == 503, what
            assert raw == self.raw, f"a rejection while banned must not write: {what}"
            assert 0 < pttl <= self.duration * 1000, what
            if side == "openresty":
                assert hit.state == 3, f"expected FORBIDDEN: {what}"
                assert hit.excess == math.trunc(self.excess), what
            return
        sent_now = float(hit.now) if side == "openresty" else None
        if side == "openresty":
            assert sent_now is not None and lo <= sent_now <= hi, f"now {hit.now} outside [{lo}, {hi}]"
        if hit.status == 200:
            assert raw is not None, what
            excess, last, forbidden = parse_state(raw)
            assert forbidden == 0, what
            assert lo <= last <= hi, f"stored last {last} outside [{lo}, {hi}]: {what}"
            if sent_now is not None:
                assert last == sent_now, f"stored last is not the now OpenResty sent ({hit.now}): {what}"
            expected = 0.0 if self.raw is None else leak(self.excess, self.last, last, self.rate_m)
            assert expected <= self.burst_m, f"the formula predicts a rejection (excess {expected}): {what}"
            assert excess == pytest.approx(expected, rel=1e-13, abs=1e-9), what
            assert 59_000 < pttl <= 60_000, f"TTL {pttl} ms after an accepted request: {what}"
            if side == "openresty":
                assert hit.state == 1 and hit.excess == math.trunc(expected), what
            self.raw, self.excess, self.last = raw, excess, last
            self.writes.append((side, raw))
            return
        assert hit.status == 503, what
        assert self.raw is not None, f"a key without state must be accepted: {what}"
        if sent_now is not None:
            expected = leak(self.excess, self.last, sent_now, self.rate_m)
            assert hit.state == 2 and hit.excess == math.trunc(expected), what
        else:
            smallest, _ = leak_range(self.excess, self.last, lo, hi, self.rate_m)
            expected = smallest
        assert expected > self.burst_m, f"the formula predicts an acceptance (excess {expected}): {what}"
        if not self.duration:
            assert raw == self.raw, f"a rejection without ban must not write: {what}"
            return
        # A ban starts: [excess, now, 1] with EXPIRE duration.
        assert raw is not None, what
        excess, last, forbidden = parse_state(raw)
        assert forbidden == 1, what
        assert lo <= last <= hi, what
        if sent_now is not None:
            assert last == sent_now, what
        assert excess == pytest.approx(leak(self.excess, self.last, last, self.rate_m), rel=1e-13, abs=1e-9), what
        assert excess > self.burst_m, what
        assert self.duration * 1000 - 500 < pttl <= self.duration * 1000, f"ban TTL {pttl} ms: {what}"
        self.raw, self.excess, self.last, self.banned = raw, excess, last, True
        self.writes.append((side, raw))

    def expired(self) -> None:
        raw, pttl = self.stored()
        assert raw is None and pttl == -2, f"the key should have expired: {raw!r}, PTTL {pttl}"
        self.raw = None
        self.banned = False


def sleep_until(t_ms: float) -> None:
    delay = (t_ms - epoch_ms()) / 1000
    if delay > 0:
        time.sleep(delay)


# ---------------------------------------------------------------------------------------------------


@pytest.mark.timing
def test_interleaved_requests_share_one_bucket(
    redis_session: RedisServer, openresty: OpenResty, interop_gateway: Gateway
) -> None:
    """2r/s burst 2 on both nodes, one key: the two nodes drain and fill one bucket."""
    zone = "interop_shared"
    gw = GatewayClient(interop_gateway)
    bucket = Bucket(redis_session, zone, rate_m=2000, burst_m=2000)
    bucket.reset()

    def run(first: str) -> list[int]:
        statuses = []
        for i in range(6):
            side = first if i % 2 == 0 else ("gateway" if first == "openresty" else "openresty")
            hit = openresty.limit(zone, "2r/s", 2) if side == "openresty" else gw.get(zone)
            bucket.check(hit, side)
            statuses.append(hit.status)
        return statuses

    # excess 0, ~1000, ~2000 accepted; ~3000 > 2000 rejected (not charged) three times
    assert run("openresty") == [200, 200, 200, 503, 503, 503]
    # 1 s drains 2000: ~1000 and ~2000 accepted, then ~3000 rejected again
    time.sleep(1.0)
    assert run("gateway") == [200, 200, 503, 503, 503, 503]
    sides = {side for side, _ in bucket.writes}
    assert sides == {"openresty", "gateway"}, bucket.writes
    gw.check_log()


LIBRARY_CASES: list[tuple[str, Callable[[int], str], str]] = [
    # (what, stored value for a clock reading `now` in ms, decision) -- zone 1r/m (rate_m 16), burst 2
    ("§5.2 live example value 999.984", lambda now: f"[999.984,{now - 1},0]", "accept"),
    ("17 significant digits", lambda now: f"[1999.9999999999997726,{now - 62600},0]", "accept"),
    ("fractional last, many decimals", lambda now: f"[1500.123456789012345,{now - 30000.5},0]", "reject"),
    ("exponent excess", lambda now: f"[9.5e2,{now - 100},0]", "accept"),
    ("cjson 14-digit fraction", lambda now: f"[1999.5040000001,{now - 2},0]", "reject"),
    # 1000.82 + 1000 - 0.016/ms: in (2000, 2001) for ~50 ms, only the fraction is over the burst
    ("over the burst by a fraction", lambda now: f"[1000.82,{now},0]", "reject"),
    ("under the burst by a fraction", lambda now: f"[999.5,{now + 20},0]", "accept"),
    ("idle long enough to clamp at 0", lambda now: f"[5.5,{now - 10_000_000},0]", "accept"),
]


@pytest.mark.parametrize("side", ["gateway", "openresty"])
def test_library_written_state_is_read_by_both(
    side: str, redis_session: RedisServer, openresty: OpenResty, interop_gateway: Gateway
) -> None:
    """Values as lua-resty-redis-ratelimit leaves them (cjson, 14 digits, fractional excess and
    last; older 17-digit values; exponents; a ban record) give each node the decision the float
    formula predicts, and it stores the formula's result."""
    zone = "interop_fmt"
    rate_m, burst_m = 16, 2000
    gw = GatewayClient(interop_gateway)
    key = rkey(zone)

    def request() -> Hit:
        return gw.get(zone) if side == "gateway" else openresty.limit(zone, "1r/m", 2)

    for what, make, decision in LIBRARY_CASES:
        for _attempt in range(3):  # a slow request can make a borderline case undecided: try again
            value = make(math.floor(epoch_ms()))
            redis_session.command("SET", key, value)
            excess, last, _ = parse_state(value)
            hit = request()
            if side == "openresty":
                low = high = leak(excess, last, float(hit.now), rate_m)
            else:
                low, high = leak_range(excess, last, hit.t_before - SLACK_MS, hit.t_after + SLACK_MS, rate_m)
            predicted = "accept" if high <= burst_m else "reject" if low > burst_m else "undecided"
            if predicted == decision:
                break
        else:
            pytest.fail(f"{what}: could not time the case ({predicted}: {low}..{high})")
        raw, pttl = redis_session.command("GET", key), int(redis_session.command("PTTL", key))
        what = f"{what}: SET {value} -> {side} {hit.status} {hit.headers.get('x-err', '')}, stored {raw!r}"
        if side == "openresty":
            assert hit.excess == math.trunc(low) and hit.state == (1 if decision == "accept" else 2), what
        if decision == "accept":
            assert hit.status == 200, what
            new_excess, new_last, forbidden = parse_state(raw)
            assert forbidden == 0, what
            assert hit.t_before - SLACK_MS <= new_last <= hit.t_after + SLACK_MS, what
            if side == "openresty":
                assert new_last == float(hit.now), what
            expected = leak(excess, last, new_last, rate_m)
            assert new_excess == pytest.approx(expected, rel=1e-13, abs=1e-9), what
            assert 59_000 < pttl <= 60_000, f"{what}: TTL {pttl}"
        else:
            assert hit.status == 503, what
            assert raw == value and pttl == -1, f"{what}: a rejection wrote (TTL {pttl})"

    # A ban record: [excess, now, 1] with the ban's EXPIRE.
    value = f"[2500.5,{math.floor(epoch_ms())},1]"
    redis_session.command("SET", key, value, "PX", "1500")
    hit = request()
    assert hit.status == 503, f"banned key: SET {value} -> {side} {hit.status}"
    if side == "openresty":
        assert (hit.state, hit.excess) == (3, 2500), hit.headers
    raw, pttl = redis_session.command("GET", key), int(redis_session.command("PTTL", key))
    assert raw == value and 0 < pttl <= 1500, f"a banned key must not be touched: {raw!r} TTL {pttl}"
    redis_session.command("DEL", key)
    gw.check_log()


def test_fractional_state_alternating(
    redis_session: RedisServer, openresty: OpenResty, interop_gateway: Gateway
) -> None:
    """At 1r/m (rate_m 16) every write has a fractional excess: each node continues exactly from
    the fraction the other stored."""
    zone = "interop_fmt"
    gw = GatewayClient(interop_gateway)
    bucket = Bucket(redis_session, zone, rate_m=16, burst_m=2000)
    bucket.reset()
    statuses = []
    for i in range(5):
        time.sleep(0.003)  # at least 3 ms apart: 0.016 per ms leaves a fraction
        side = "openresty" if i % 2 == 0 else "gateway"
        hit = openresty.limit(zone, "1r/m", 2) if side == "openresty" else gw.get(zone)
        bucket.check(hit, side)
        statuses.append(hit.status)
    assert statuses == [200, 200, 200, 503, 503]
    fractions = [json.loads(raw)[0] % 1 for _, raw in bucket.writes[1:]]
    assert all(f != 0 for f in fractions), bucket.writes
    bucket.reset()
    gw.check_log()


def test_bans_hold_on_both_sides(redis_session: RedisServer, openresty: OpenResty, interop_gateway: Gateway) -> None:
    """A ban started by one node (duration / ban: 3s) is honoured by the other until it expires."""
    gw = GatewayClient(interop_gateway)
    a = Bucket(redis_session, "interop_ban_a", rate_m=2000, burst_m=2000, duration=3)
    b = Bucket(redis_session, "interop_ban_b", rate_m=2000, burst_m=2000, duration=3)
    a.reset()
    b.reset()

    # A: the OpenResty node overflows with duration=3 -> BUSY and the key is banned.
    statuses = []
    for _ in range(4):
        hit = openresty.limit("interop_ban_a", "2r/s", 2, duration=3)
        a.check(hit, "openresty")
        statuses.append(hit.status)
    assert statuses == [200, 200, 200, 503] and a.banned
    ban_a_end = hit.t_after + 3000
    a.check(gw.get("interop_ban_a"), "gateway")  # 503, nothing written
    a.check(openresty.limit("interop_ban_a", "2r/s", 2, duration=3), "openresty")  # FORBIDDEN

    # B: the gateway (ban: 3s) overflows -> the OpenResty node gets FORBIDDEN.
    statuses = []
    for _ in range(4):
        hit = gw.get("interop_ban_b")
        b.check(hit, "gateway")
        statuses.append(hit.status)
    assert statuses == [200, 200, 200, 503] and b.banned
    ban_b_end = hit.t_after + 3000
    hit = openresty.limit("interop_ban_b", "2r/s", 2, duration=3)
    b.check(hit, "openresty")
    assert hit.state == 3
    b.check(gw.get("interop_ban_b"), "gateway")

    # Late in the bans: still held on both sides (and not extended).
    sleep_until(min(ban_a_end, ban_b_end) - 400)
    a.check(gw.get("interop_ban_a"), "gateway")
    b.check(openresty.limit("interop_ban_b", "2r/s", 2, duration=3), "openresty")

    # Just after they end: both keys are gone and the other side accepts from excess 0.
    sleep_until(max(ban_a_end, ban_b_end) + 100)
    a.expired()
    b.expired()
    a.check(gw.get("interop_ban_a"), "gateway")
    b.check(openresty.limit("interop_ban_b", "2r/s", 2, duration=3), "openresty")
    assert json.loads(a.raw or "")[0] == 0 and json.loads(b.raw or "")[0] == 0
    gw.check_log()


def test_evalsha_arguments_are_the_librarys(
    redis_session: RedisServer, openresty: OpenResty, interop_gateway: Gateway
) -> None:
    """MONITOR shows the OpenResty node's call exactly as the library makes it, and the sha is
    sha1 of limit_req.lua; the gateway's own call is recorded for comparison."""
    from gateway.store import lua

    zone = "interop_argv"
    key = rkey(zone)
    key2 = rkey(zone, b"argv-k2")
    redis_session.command("DEL", key, key2)
    file_sha = hashlib.sha1(script_path().read_bytes()).hexdigest()
    assert file_sha == lua.sha1("limit_req.lua"), "the gateway's view of limit_req.lua differs from the file"

    monitor = Monitor(redis_session.port)
    try:
        hit1 = openresty.limit(zone, "30r/m", 2, duration=0)
        hit2 = openresty.limit(zone, "1r/m", 0.5, duration=7, key="argv-k2")
        assert (hit1.status, hit1.state, hit1.excess) == (200, 1, 0), hit1.headers
        assert (hit2.status, hit2.state, hit2.excess) == (200, 1, 0), hit2.headers
        before_gateway = monitor.wait_for(lambda src, args: args[:2] == [b"EXPIRE", key2])
        gw_hit = GatewayClient(interop_gateway).get(zone)
        everything = monitor.wait_for(
            lambda src, args: args[:1] == [b"EVALSHA"] and args[1] == lua.sha1("batch.lua").encode()
        )
    finally:
        monitor.close()

    client_cmds = [args for src, args in before_gateway if src != "lua" and args and args[0].upper() == b"EVALSHA"]
    assert len(client_cmds) == 2, before_gateway
    for args, hit, (k, rate_m, burst_m, duration) in zip(
        client_cmds, (hit1, hit2), ((key, b"500", b"2000", b"0"), (key2, b"16", b"500", b"7")), strict=True
    ):
        now = hit.now
        assert re.fullmatch(r"\d+(\.\d+)?", now), now
        assert format(float(now), ".14g") == now, f"now {now!r} is not Lua's %.14g"
        assert abs(float(now) - hit.t_after) < 1000
        assert args == [b"EVALSHA", file_sha.encode(), b"1", k, rate_m, burst_m, now.encode(), duration], args
        assert re.fullmatch(rb"[0-9a-f]{40}", args[1])
        assert hit.headers["x-sha"] == file_sha

    # What the script did for a fresh key, as the library's script does: GET, SET [0,now,0], EXPIRE 60.
    inner = [args for src, args in before_gateway if src == "lua"]
    for k, hit in ((key, hit1), (key2, hit2)):
        assert [a for a in inner if a[1:2] == [k]] == [
            [b"GET", k],
            [b"SET", k, f"[0,{hit.now},0]".encode()],
            [b"EXPIRE", k, b"60"],
        ], inner

    # The gateway runs its batch.lua (request.lua per request, per-key code included from limit_req.lua)
    # on the same Redis key; it never calls limit_req.lua itself.
    gateway_cmds = [
        args for src, args in everything[len(before_gateway) :] if src != "lua" and args[:1] == [b"EVALSHA"]
    ]
    assert gateway_cmds, everything
    gw_args = gateway_cmds[0]
    assert gw_args[1] == lua.sha1("batch.lua").encode() and gw_args[2] == b"1" and gw_args[3] == key, gw_args
    assert all(args[1] != file_sha.encode() for args in gateway_cmds)
    assert gw_hit.status == 200
    raw = redis_session.command("GET", key)
    excess, last, forbidden = parse_state(raw)
    assert forbidden == 0
    assert excess == pytest.approx(leak(0.0, float(hit1.now), last, 500), rel=1e-13, abs=1e-9), raw
    redis_session.command("DEL", key, key2)


def test_openresty_recovers_from_noscript(
    redis_session: RedisServer, openresty: OpenResty, interop_gateway: Gateway
) -> None:
    """After SCRIPT FLUSH the OpenResty node's next call fails with NOSCRIPT and forgets its sha
    (the library's behaviour, no retry in the same call); the call after that loads the script
    again and works, on the state the gateway kept writing meanwhile."""
    zone = "interop_noscript"
    gw = GatewayClient(interop_gateway)
    bucket = Bucket(redis_session, zone, rate_m=2000, burst_m=2000)
    bucket.reset()
    file_text = script_path().read_bytes()
    file_sha = hashlib.sha1(file_text).hexdigest()

    warm = openresty.limit(zone, "2r/s", 2)
    bucket.check(warm, "openresty")
    loads = int(warm.headers["x-loads"])
    assert warm.headers["x-sha"] == file_sha

    redis_session.command("SCRIPT", "FLUSH")
    monitor = Monitor(redis_session.port)
    try:
        failed = openresty.limit(zone, "2r/s", 2)
        assert failed.status == 500 and failed.headers.get("x-err", "").startswith("NOSCRIPT"), failed.headers
        assert failed.headers.get("x-sha", "") == "" and int(failed.headers["x-loads"]) == loads
        assert bucket.stored()[0] == bucket.raw, "the failed call must not change the state"

        hit = gw.get(zone)  # the gateway reloads its own scripts (batch.lua, undo.lua)
        bucket.check(hit, "gateway")
        assert hit.status == 200

        again = openresty.limit(zone, "2r/s", 2)
        bucket.check(again, "openresty")
        assert again.status == 200 and again.state == 1
        assert int(again.headers["x-loads"]) == loads + 1 and again.headers["x-sha"] == file_sha
        cmds = monitor.wait_for(lambda src, args: args[:2] == [b"EVALSHA", file_sha.encode()]
                                and args[6:7] == [again.now.encode()])  # fmt: skip
    finally:
        monitor.close()

    client = [args for src, args in cmds if src != "lua" and args[:1] in ([b"EVALSHA"], [b"SCRIPT"])]
    ours = [a for a in client if a[0] == b"SCRIPT" and a[2:3] == [file_text]]
    assert len(ours) == 1, "the OpenResty node loads limit_req.lua exactly once after the flush"
    at = client.index(ours[0])
    assert client[at + 1][:2] == [b"EVALSHA", file_sha.encode()], client
    assert client[at + 1][6] == again.now.encode()
    gw.check_log()


GRID_RATES = ["1r/s", "2r/s", "3r/s", "7r/s", "10r/s", "1000r/s", "1r/m", "3r/m", "7r/m", "30r/m", "100r/m"]
GRID_BURSTS = [1, 3, 10]
GRID_REQUESTS = 24  # per rate and burst, after the opening three


def _rounding_case(rate_m: int, burst_m: int) -> int | None:
    """A gap after two requests at t=0 (stored excess 1000) that leaves an excess whose library
    delay, in double arithmetic, falls 1 ms short of the exact quotient (3r/m: 1606 / 50 s is
    32119.999... ms), if this rate and burst have one; None otherwise."""
    second = resty_req.State(1000.0, 0.0)
    for whole in range(min(burst_m, 1999), 0, -1):
        if resty_req.delay_ms(whole, rate_m) == whole * 1000 // rate_m:
            continue
        dt = (1999 - whole) * 1000 // rate_m + 1  # the first ms at which 2000 - leak drops below whole + 1
        code, excess, _, _ = resty_req.step(second, rate_m, burst_m, dt, 0)
        if code == resty_req.OK and resty_req.reply_integer(excess) == whole:
            return dt
    return None


def _timings(rate_m: int, burst_m: int, rng: random.Random) -> list[int]:
    """Request times (ms from the fake clock's start): same-ms pairs, gaps shorter and longer
    than one emission interval, long idles, and the rate's rounding case when it has one."""
    period = max(1, 1_000_000 // rate_m)
    times = [0, 0]
    tricky = _rounding_case(rate_m, burst_m)
    times.append(tricky if tricky is not None else period // 2)
    t = times[-1]
    for _ in range(GRID_REQUESTS):
        t += rng.choice([0, 1, rng.randint(1, 9), rng.randint(0, period // 3 + 1),
                         rng.randint(0, period + 1), rng.randint(period // 2, 2 * period + 2),
                         rng.randint(0, 12 * period)])  # fmt: skip
        times.append(t)
    return times


async def test_delays_agree_to_the_millisecond(redis_session: RedisServer, openresty: OpenResty) -> None:
    """For every rate (3r/s and 7r/m included, where the division does not come out even) and
    burst, and request times from a fixed seed: from the same stored state and the same ``now``,
    the gateway's Redis store and the OpenResty node decide alike, store the same value, report
    the same integer excess, and the gateway delays exactly the ms the node sleeps."""
    tag = uuid.uuid4().hex[:8]
    zones = "\n".join(f"  ms{tag}_{i}: {{type: req, key: $arg_k, rate: {rate}}}" for i, rate in enumerate(GRID_RATES))
    routes = "\n".join(
        f"  - {{location: /ms{i}_{burst}, upstream: app, limit_req: [{{zone: ms{tag}_{i}, burst: {burst}}}]}}"
        for i in range(len(GRID_RATES))
        for burst in GRID_BURSTS
    )
    clock = FakeClock()
    store = RedisStore(RedisSpec(url=redis_session.url, timeout_ms=2000, on_error="deny", prefix=""), clock_ms=clock)
    await store.start()
    seen = {"delayed": 0, "rejected": 0, "double_rounding": 0, "old_rule_differs": 0}
    try:
        grid = Scenario(store, clock, config(zones, routes))
        for i, rate in enumerate(GRID_RATES):
            for burst in GRID_BURSTS:
                location, zone = f"/ms{i}_{burst}", f"ms{tag}_{i}"
                lim = grid.routes[location].limit_req[0]
                key = f"k{burst}".encode()
                rkey = f"{zone}:".encode() + key
                previous: tuple[float, float] | None = None  # the stored (excess, last) before a request
                for t in _timings(lim.rate_m, lim.burst_m, random.Random(f"{rate}/{burst}")):
                    before = redis_session.command("GET", rkey)
                    ours = await grid.hit(location, t, key)
                    after_ours = redis_session.command("GET", rkey)
                    # the node starts from the same stored value, at the same now
                    if before is None:
                        redis_session.command("DEL", rkey)
                    else:
                        redis_session.command("SET", rkey, before)
                    theirs = openresty.limit(zone, rate, burst, key=key.decode(), now=T0 + t)
                    after_theirs = redis_session.command("GET", rkey)
                    what = f"{rate} burst {burst} t={t}: stored {before!r}; gateway {ours.req} " + (
                        f"excess {ours.excess} delay {ours.delay_ms}; node {theirs.status} {theirs.headers}"
                    )
                    assert int(theirs.headers["x-rate"]) == lim.rate_m, what
                    assert after_theirs == after_ours, what
                    assert theirs.excess == ours.excess, what
                    if ours.req in ("PASSED", "DELAYED"):
                        assert (theirs.status, theirs.state) == (200, 1), what
                        assert theirs.sleep_ms == ours.delay_ms, what
                        assert (ours.req == "DELAYED") == (ours.delay_ms > 0), what
                        exact = ours.excess * 1000 // lim.rate_m
                        seen["delayed"] += ours.delay_ms > 0
                        seen["double_rounding"] += ours.delay_ms != exact
                        if previous is not None:
                            stored = max(0.0, previous[0] - lim.rate_m * abs(T0 + t - previous[1]) / 1000 + 1000)
                            seen["old_rule_differs"] += ours.delay_ms != math.floor(stored * 1000 / lim.rate_m)
                        excess, last, _ = parse_state(after_ours or "")
                        previous = (excess, last)
                    else:
                        assert ours.req == "REJECTED" and (theirs.status, theirs.state) == (503, 2), what
                        seen["rejected"] += 1
                    # the state both wrote is kept; it expires 60 s of real time after the last write
                redis_session.command("DEL", rkey)
    finally:
        await store.close()
    # the grid reaches what matters: delays, rejections, and both ways the old rule was wrong
    assert all(n > 0 for n in seen.values()), seen
