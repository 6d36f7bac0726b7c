"""The differential tests' own model, checked against limit-semantics.md §8 and against the gateway's.

No nginx needed: these run everywhere and keep the model honest, since the differential
tests derive their tolerances from it.
"""

from __future__ import annotations

import random

from gateway.limits import nginx_req, params
from tests.support.differential.model import (
    DELAYED,
    DELAYED_DRY_RUN,
    PASSED,
    REJECTED,
    REJECTED_DRY_RUN,
    T0,
    analyse,
    simulate,
)
from tests.support.differential.scenario import ConnZone, LimitConn, LimitReq, Location, ReqZone, Scenario, req


def run(scn: Scenario, *, upstream: int = 1) -> list[tuple[int, str, str, int, int | None]]:
    n = len(scn.requests)
    outs = simulate(scn, [T0 + r.t for r in scn.requests], [upstream] * n, [float(i) for i in range(n)])
    return [(o.status, o.limit_req_status, o.limit_conn_status, o.duration_ms, o.excess) for o in outs]


def test_v1_basic_nodelay():
    scn = Scenario(
        "v1",
        (ReqZone("one", "$arg_k", "2r/s"),),
        (
            Location("a", (LimitReq("one", burst=1, nodelay=True),)),
            Location("s", (LimitReq("one", burst=1, nodelay=True),), limit_req_status=501),
        ),
        (req(0, "a", k="x"), req(1, "a", k="x"), req(2, "a", k="x"), req(3, "s", k="x"), req(1200, "a", k="x")),
    )
    assert run(scn) == [
        (200, PASSED, "", 0, None),
        (200, PASSED, "", 0, None),
        (503, REJECTED, "", 0, 1996),
        (501, REJECTED, "", 0, 1994),
        (200, PASSED, "", 0, None),
    ]


def test_v2_two_zones():
    zones = (ReqZone("fast", "$arg_b", "1000r/s"), ReqZone("slow", "$arg_a", "1r/m"))
    loc = Location("a", (LimitReq("fast"), LimitReq("slow")))
    scn = Scenario(
        "v2",
        zones,
        (loc,),
        (
            req(0, "a", b="1"),
            req(100, "a", b="1"),
            req(200, "a", a="1"),
            req(300, "a", a="1"),
            req(400, "a", a="2", b="2"),
            req(500, "a", a="2", b="2"),
            req(600, "a"),
            req(700, "a"),
        ),
    )
    statuses = [(s, lr) for s, lr, *_ in run(scn)]
    assert statuses == [
        (200, PASSED),
        (200, PASSED),
        (200, PASSED),
        (503, REJECTED),
        (200, PASSED),
        (503, REJECTED),
        (200, ""),
        (200, ""),
    ]


def test_v3_delay_two_stage():
    scn = Scenario(
        "v3",
        (ReqZone("one", "$arg_k", "30r/m"),),
        (Location("a", (LimitReq("one", burst=2, delay=1),)),),
        (req(0, "a", k="x"), req(0, "a", k="x"), req(0, "a", k="x"), req(200, "a", k="x")),
    )
    assert run(scn) == [
        (200, PASSED, "", 0, None),
        (200, PASSED, "", 0, None),
        (200, DELAYED, "", 2000, 2000),
        (503, REJECTED, "", 0, 2900),
    ]


def test_v4_dry_run():
    scn = Scenario(
        "v4",
        (ReqZone("one", "$arg_k", "1r/m"),),
        (
            Location("delay", (LimitReq("one", burst=2),), dry_run=True),
            Location("reject", (LimitReq("one"),), dry_run=True),
            Location("off", (LimitReq("one"),)),
        ),
        (req(0, "delay", k="x"), req(1, "delay", k="x"), req(2, "reject", k="x"), req(3, "off", k="x")),
    )
    assert run(scn) == [
        (200, PASSED, "", 0, None),
        (200, DELAYED_DRY_RUN, "", 0, 1000),
        (200, REJECTED_DRY_RUN, "", 0, 2000),
        (503, REJECTED, "", 0, 2000),
    ]


def test_v5_per_minute_truncation():
    scn = Scenario(
        "v5",
        (ReqZone("one", "$arg_k", "1r/m"),),
        (Location("a", (LimitReq("one"),)),),
        (
            req(0, "a", k="e1"),
            req(60500, "a", k="e1"),
            req(63100, "a", k="e1"),
            req(0, "a", k="e2"),
            req(62300, "a", k="e2"),
            req(62800, "a", k="e2"),
        ),
    )
    assert [(s, e) for s, _, _, _, e in run(scn)] == [
        (200, None),
        (503, 32),
        (200, None),
        (200, None),
        (503, 4),
        (200, None),
    ]


def test_v6_v7_burst_and_nodelay():
    zones = (ReqZone("one", "$arg_k", "2r/s"),)
    delayed = Scenario(
        "v6", zones, (Location("a", (LimitReq("one", burst=3),)),), tuple(req(0, "a", k="x") for _ in range(5))
    )
    assert [(s, lr, d) for s, lr, _, d, _ in run(delayed)] == [
        (200, PASSED, 0),
        (200, DELAYED, 500),
        (200, DELAYED, 1000),
        (200, DELAYED, 1500),
        (503, REJECTED, 0),
    ]
    nodelay = Scenario("v7", zones, (Location("a", (LimitReq("one", burst=3, nodelay=True),)),), delayed.requests)
    assert [(s, lr, d) for s, lr, _, d, _ in run(nodelay)] == [(200, PASSED, 0)] * 4 + [(503, REJECTED, 0)]


def test_v8_v9_several_limits():
    zones = (ReqZone("A", "$arg_k", "1r/s"), ReqZone("B", "$arg_k", "2r/s"))
    v8 = Scenario(
        "v8",
        zones,
        (Location("a", (LimitReq("A", burst=5), LimitReq("B", burst=5))),),
        tuple(req(0, "a", k="x") for _ in range(3)),
    )
    assert [d for *_, d, _ in run(v8)] == [0, 1000, 2000]
    zones9 = (ReqZone("A", "$arg_k", "1r/s"), ReqZone("B", "$arg_b", "1r/m"))
    v9 = Scenario(
        "v9",
        zones9,
        (Location("a", (LimitReq("A", burst=5), LimitReq("B"))),),
        (req(0, "a", k="k", b="b1"), req(0, "a", k="k", b="b1"), req(0, "a", k="k", b="b2")),
    )
    assert [(s, lr, d) for s, lr, _, d, _ in run(v9)] == [(200, PASSED, 0), (503, REJECTED, 0), (200, DELAYED, 1000)]


def test_v10_limit_conn():
    zones = (ConnZone("c", "$arg_k"), ConnZone("c2", "$arg_k"))
    locs = (
        Location("one", limit_conn=(LimitConn("c", 1),)),
        Location("five", limit_conn=(LimitConn("c", 5),)),
        Location("dry", limit_conn=(LimitConn("c", 1),), dry_run=True),
        Location("c2", limit_conn=(LimitConn("c2", 1),)),
        Location("both", limit_conn=(LimitConn("c", 5), LimitConn("c2", 1))),
    )
    scn = Scenario(
        "v10",
        zones,
        locs,
        (
            req(0, "one", hold=1000, k="u"),
            req(0, "c2", hold=1000, k="v"),
            req(100, "one", k="u"),
            req(200, "five", k="u"),
            req(300, "dry", k="u"),
            req(400, "one", k="other"),
            req(500, "both", k="v"),
            req(600, "one", k="v"),  # c's count for v was rolled back by the previous request
            req(1500, "one", k="u"),
        ),
    )
    assert [(s, lc) for s, _, lc, _, _ in run(scn)] == [
        (200, PASSED),
        (200, PASSED),
        (503, REJECTED),
        (200, PASSED),
        (200, REJECTED_DRY_RUN),
        (200, PASSED),
        (503, REJECTED),
        (200, PASSED),
        (200, PASSED),
    ]


def test_delayed_request_takes_its_conn_slot_after_the_delay():
    scn = Scenario(
        "delayconn",
        (ReqZone("r", "$arg_k", "2r/s"), ConnZone("c", "$arg_k")),
        (
            Location("rc", (LimitReq("r", burst=5),), (LimitConn("c", 1),)),
            Location("one", limit_conn=(LimitConn("c", 1),)),
        ),
        (req(0, "rc", k="x"), req(20, "rc", hold=600, k="x"), req(100, "one", k="x"), req(800, "one", k="x")),
    )
    assert [(s, lr, lc, d) for s, lr, lc, d, _ in run(scn)] == [
        (200, PASSED, PASSED, 0),
        (200, DELAYED, PASSED, 480 + 600),
        (200, "", PASSED, 0),
        (503, "", REJECTED, 0),
    ]


def test_jitter_marks_only_boundary_requests():
    zones = (ReqZone("one", "$arg_k", "2r/s"),)
    scn = Scenario(
        "jit",
        zones,
        (Location("a", (LimitReq("one", nodelay=True),)),),
        (req(0, "a", k="x"), req(490, "a", k="x"), req(1000, "a", k="y"), req(1200, "a", k="y")),
    )
    analysis = analyse(scn, 25)
    # 490 ms after a request at 2r/s is within 25+25 ms of the 500 ms boundary: either outcome
    assert set(analysis.possible[1]) == {(200, PASSED, ""), (503, REJECTED, "")}
    assert [analysis.sensitive(i) for i in range(4)] == [False, True, False, False]
    assert set(analysis.possible[3]) == {(503, REJECTED, "")}
    assert analysis.possible[3][(503, REJECTED, "")].excess == (
        0 - 2000 * 250 // 1000 + 1000,
        0 - 2000 * 150 // 1000 + 1000,
    )


# -- cross-check with the gateway's pure model ------------------------------------------------------


class DictTable:
    def __init__(self) -> None:
        self.d: dict[bytes, int] = {}

    def get(self, key: bytes) -> int | None:
        return self.d.get(key)

    def peek(self, key: bytes) -> int | None:
        return self.d.get(key)

    def put(self, key: bytes, state: int) -> None:
        self.d[key] = state

    def insert(self, key: bytes, state: int, now: int) -> bool:
        self.d[key] = state
        return True

    def delete(self, key: bytes) -> None:
        self.d.pop(key, None)


def test_model_agrees_with_gateway_pure_model_on_random_schedules():
    rng = random.Random(7)
    rates = ["1r/s", "2r/s", "7r/s", "1r/m", "30r/m", "100r/m", "1000r/s"]
    for trial in range(300):
        nlim = rng.choice((1, 1, 2, 3))
        zones = tuple(
            ReqZone(f"z{i}", rng.choice(("$arg_a", "$arg_b", "$arg_c")), rng.choice(rates)) for i in range(nlim)
        )
        limits = []
        for i in range(nlim):
            mode = rng.choice(("delay", "nodelay", "two"))
            burst = rng.choice((0, 1, 2, 5))
            limits.append(
                LimitReq(
                    f"z{i}",
                    burst=burst,
                    nodelay=mode == "nodelay",
                    delay=rng.choice((1, 2)) if mode == "two" and burst else 0,
                )
            )
        loc = Location("a", tuple(limits))
        t = 0
        requests = []
        for _ in range(25):
            t += rng.choice((0, 0, 1, 7, 50, 200, 700, 3000))
            args = {name: rng.choice(("", "1", "2")) for name in ("a", "b", "c")}
            requests.append(req(t, "a", **{k: v for k, v in args.items() if v}))
        scn = Scenario("x", zones, (loc,), tuple(requests))
        mine = run(scn)
        zone_params = [
            params.ReqParams(
                z.name,
                z.rate_m,
                lim.burst * 1000,
                (2**63 - 1) // 1000 * 1000 if lim.nodelay else lim.delay * 1000,
            )
            for z, lim in zip(zones, limits, strict=True)
        ]
        tables = [DictTable() for _ in zones]
        for i, r in enumerate(requests):
            args = dict(r.args)
            keys = [args.get(z.key[5:], "").encode() for z in zones]
            decision = nginx_req.decide(zone_params, tables, keys, T0 + r.t)
            if decision.rc == nginx_req.OK:
                nginx_req.commit(decision, tables)
            _, lreq, _, delay, excess = mine[i]
            if decision.rc == nginx_req.DECLINED:
                assert lreq == "", (trial, i)
            elif decision.rc == nginx_req.BUSY:
                assert (lreq, excess) == (REJECTED, decision.excess), (trial, i)
            else:
                assert decision.rc == nginx_req.OK
                assert delay == decision.delay_ms, (trial, i, delay, decision)
                assert lreq == (DELAYED if delay else PASSED), (trial, i)
                if delay:
                    assert excess == decision.excess, (trial, i)
