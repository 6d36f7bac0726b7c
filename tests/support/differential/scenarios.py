"""The scenarios replayed through nginx and the gateway (all hosted at once, run in parallel).

Times are ms from the scenario's start. Unless a scenario says otherwise, keys are ``$arg_k``.
Expected outcomes are NOT written here: they come from the model (model.py), and the model
itself is pinned to limit-semantics.md §8 by test_model.py.
"""

from __future__ import annotations

from tests.support.differential.scenario import ConnZone, LimitConn, LimitReq, Location, ReqZone, Scenario, req

BURST_DELAY = Scenario(
    "burst_delay",
    (ReqZone("one", "$arg_k", "2r/s"),),
    (Location("a", (LimitReq("one", burst=3),)),),
    (
        # V6: five at once -> 0, 500, 1000, 1500 ms, fifth rejected (excess 4000 > 3000)
        *(req(0, "a", k="a") for _ in range(5)),
        req(0, "a", k="b", note="another key: its own bucket"),
        req(1200, "a", k="a", note="3000 - 2400 + 1000 = 1600 -> delayed 800"),
        req(1300, "a", k="a", note="1600 - 200 + 1000 = 2400 -> delayed 1200"),
        req(1400, "a", k="a", note="2400 - 200 + 1000 = 3200 -> rejected"),
        req(1900, "a", k="a", note="2400 - 1200 + 1000 = 2200 -> delayed 1100"),
    ),
    doc="2r/s burst=3: delays at 1/rate spacing, rejection over the burst, uncharged rejections",
)

NODELAY = Scenario(
    "nodelay",
    (ReqZone("one", "$arg_k", "2r/s"),),
    (
        Location("a", (LimitReq("one", burst=3, nodelay=True),)),
        Location("custom", (LimitReq("one", burst=3, nodelay=True),), limit_req_status=429),
    ),
    (
        # V7: four pass undelayed (status PASSED, not DELAYED), the fifth is rejected
        *(req(0, "a", k="a") for _ in range(5)),
        req(800, "a", k="a", note="3000 - 1600 + 1000 = 2400 -> passed"),
        req(900, "a", k="a", note="2400 - 200 + 1000 = 3200 -> rejected"),
        req(920, "custom", k="a", note="same zone, limit_req_status 429"),
        req(1700, "a", k="a", note="rejections were not charged: 2400 - 1800 + 1000 = 1600"),
    ),
    doc="2r/s burst=3 nodelay, and limit_req_status 429 on a second location of the same zone",
)

PER_MINUTE = Scenario(
    "per_minute",
    (ReqZone("hundred", "$arg_k", "100r/m"), ReqZone("thirty", "$arg_k", "30r/m")),
    (
        Location("nd", (LimitReq("hundred", burst=2, nodelay=True),)),
        Location("dl", (LimitReq("hundred", burst=3),)),
        Location("two", (LimitReq("thirty", burst=2, delay=1),)),
    ),
    (
        # 100r/m: rate_m 1666
        *(req(0, "nd", k="a") for _ in range(4)),
        req(700, "nd", k="a", note="2000 - 1166 + 1000 = 1834 -> passed"),
        req(800, "nd", k="a", note="1834 - 166 + 1000 = 2668 -> rejected"),
        req(1400, "nd", k="a", note="1834 - 1166 + 1000 = 1668 -> passed"),
        *(req(0, "dl", k="b") for _ in range(3)),  # delays 0, 600, 1200 (1000*1000//1666)
        # V3 (limit_req_delay.t): 30r/m burst=2 delay=1
        *(req(0, "two", k="c") for _ in range(3)),  # passed, passed (excess 1000 = delay), delayed 2000
        req(200, "two", k="c", note="2000 - 100 + 1000 = 2900 -> rejected"),
        req(2600, "two", k="c", note="2000 - 1300 + 1000 = 1700 -> delayed (1700-1000)*2 = 1400"),
        req(2700, "two", k="c", note="1700 - 50 + 1000 = 2650 -> rejected"),
    ),
    doc="r/m rates (100r/m truncated to 1666 m-req/s, 30r/m), delay= two-stage limiting",
)

TRUNCATION = Scenario(
    "truncation",
    (ReqZone("slow", "$arg_k", "1r/m"),),
    (
        Location("a", (LimitReq("slow"),)),
        Location("b", (LimitReq("slow", burst=3, nodelay=True),)),
    ),
    (
        # 1r/m is 16 m-req/s, not 16.67: after 4 s the leak is 64 (an exact limiter: 66.7)
        req(0, "a", k="a"),
        req(4000, "a", k="a", note="rejected, logged excess 1000 - 64 = 0.936"),
        # every commit drops the leak's fraction (16 * 1100 // 1000 = 17, not 17.6)
        req(0, "b", k="b"),
        req(1100, "b", k="b"),
        req(2200, "b", k="b"),
        req(3300, "b", k="b"),
        req(4400, "b", k="b", note="rejected, excess 4000 - 4*17 = 3.932"),
    ),
    doc="1r/m: rate_m = 16 and per-commit truncation, observed through the logged excess",
)

TWO_ZONES = Scenario(
    "two_zones",
    (ReqZone("fast", "$arg_b", "1000r/s"), ReqZone("slow", "$arg_a", "1r/m")),
    (
        Location("t", (LimitReq("fast"), LimitReq("slow"))),
        Location("t2", (LimitReq("fast", nodelay=True), LimitReq("slow", nodelay=True))),
    ),
    (
        # limit_req2.t, pairs 100 ms apart
        req(0, "t", b="1"),
        req(100, "t", b="1", note="fast drained 100000 m-req in 0.1 s"),
        req(200, "t", a="1"),
        req(300, "t", a="1", note="slow: 1000 - 1 + 1000 > 0 -> rejected"),
        req(400, "t", a="2", b="2"),
        req(500, "t", a="2", b="2", note="fast AGAIN, slow BUSY: rejected, fast not charged"),
        req(600, "t"),
        req(700, "t", note="no keys: not limited, empty $limit_req_status"),
        req(800, "t2", b="3"),
        req(900, "t2", b="3"),
        req(1000, "t2", a="3"),
        req(1100, "t2", a="3"),
        req(1200, "t2", a="4", b="4"),
        req(1300, "t2", a="4", b="4"),
        req(1400, "t2"),
        req(1500, "t2"),
    ),
    doc="limit_req2.t: two zones keyed $arg_b (1000r/s) and $arg_a (1r/m), delayed and nodelay",
)

SEVERAL_LIMITS = Scenario(
    "several_limits",
    (
        ReqZone("A", "$arg_k", "1r/s"),
        ReqZone("B", "$arg_c", "1r/m"),
        ReqZone("M1", "$arg_k", "1r/s"),
        ReqZone("M2", "$arg_k", "2r/s"),
    ),
    (
        Location("v9", (LimitReq("A", burst=5), LimitReq("B"))),
        Location("mx", (LimitReq("M1", burst=5), LimitReq("M2", burst=5))),
    ),
    (
        # V9: a request rejected by the second zone does not charge the first
        req(0, "v9", k="k", c="c1"),
        req(100, "v9", k="k", c="c1", note="B rejects (999 > 0); A is not charged"),
        req(200, "v9", k="k", c="c2", note="A: 0 - 200 + 1000 = 800 -> delayed 800 (1800 if charged)"),
        # V8: the longest delay of all limits wins (M1 at 1r/s beats M2 at 2r/s)
        *(req(0, "mx", k="m") for _ in range(3)),  # 0, 1000, 2000 ms, logged by zone M1
    ),
    doc="several limit_req on one location: rollback of earlier zones, maximum delay",
)

AGAIN_PATH = Scenario(
    "again_path",
    (ReqZone("A", "$arg_a", "2r/s"), ReqZone("B", "$arg_b", "1r/m")),
    (Location("l", (LimitReq("A", burst=3), LimitReq("B", burst=1, nodelay=True))),),
    (
        # the last limit's key is empty: A stays AGAIN, is committed, and its delay applies
        *(req(0, "l", a="x") for _ in range(3)),  # 0, 500, 1000 ms, logged by zone A
        req(100, "l", a="x", b="y", note="A AGAIN (2800), B new: delayed 1400 by A"),
        req(200, "l", a="x", b="y", note="A BUSY (3600 > 3000): rejected before B is looked at"),
        req(300, "l", b="y", note="B only: 0 - 3 + 1000 = 997 <= 1000, nodelay: passed"),
        req(400, "l", b="y", note="997 - 1 + 1000 = 1996 > 1000: rejected"),
    ),
    doc="several limits where the last key is empty (rc AGAIN), and an early zone rejecting",
)

CLIENT_ADDRESS = Scenario(
    "client_address",
    (ReqZone("ip", "$binary_remote_addr", "5r/s"), ReqZone("ipr", "$binary_remote_addr$arg_r", "1r/s")),
    (
        Location("ip", (LimitReq("ip", burst=2, nodelay=True),)),
        Location("ipr", (LimitReq("ipr"),)),
    ),
    (
        *(req(0, "ip") for _ in range(4)),  # passed x3, the 4th rejected (3000 > 2000)
        req(300, "ip", note="2000 - 1500 + 1000 = 1500: passed"),
        req(0, "ipr", r="1"),
        req(100, "ipr", r="2", note="another composite key"),
        req(200, "ipr", r="1", note="0 - 200 + 1000 = 800 > 0: rejected"),
        req(300, "ipr", note="key = the address alone (never empty): passed"),
        req(400, "ipr", note="900 > 0: rejected"),
    ),
    doc="keys $binary_remote_addr and $binary_remote_addr$arg_r (limit_conn_complex.t style)",
)

DRY_RUN = Scenario(
    "dry_run",
    (ReqZone("one", "$arg_k", "1r/m"), ConnZone("c", "$arg_k")),
    (
        Location("delay", (LimitReq("one", burst=2),), dry_run=True),
        Location("reject", (LimitReq("one"),), dry_run=True),
        Location("off", (LimitReq("one"),)),
        Location("none"),
        Location("both", (LimitReq("one", burst=2),), (LimitConn("c", 1),), dry_run=True),
    ),
    (
        # limit_req_dry_run.t / V4
        req(0, "delay", k="d"),
        req(100, "delay", k="d", note="DELAYED_DRY_RUN, not delayed, excess 999 stored"),
        req(200, "reject", k="d", note="REJECTED_DRY_RUN: 200, not stored"),
        req(300, "off", k="d", note="dry run off: 503 REJECTED"),
        req(400, "none", k="d", note="no limit: empty $limit_req_status"),
        req(500, "delay", k="d", note="999 - 6 + 1000 = 1993 -> DELAYED_DRY_RUN"),
        req(600, "delay", k="d", note="1993 - 1 + 1000 = 2992 > 2000 -> REJECTED_DRY_RUN"),
        req(700, "off", k="e", note="another key: passes"),
        # both dry runs: a DELAYED_DRY_RUN request goes on at once, so it meets limit_conn at once
        req(0, "both", hold=500, k="z", note="PASSED/PASSED, holds c:z until ~500"),
        req(100, "both", k="z", note="DELAYED_DRY_RUN, then REJECTED_DRY_RUN by limit_conn: 200"),
        req(800, "both", k="z", note="999 - 11 + 1000 = 1988: DELAYED_DRY_RUN, conn PASSED"),
    ),
    doc="limit_req_dry_run: PASSED, DELAYED_DRY_RUN (accounted, not delayed), REJECTED_DRY_RUN",
)

LIMIT_CONN = Scenario(
    "limit_conn",
    (ConnZone("c", "$arg_k"), ConnZone("c2", "$arg_k"), ReqZone("r", "$arg_k", "2r/s")),
    (
        Location("one", limit_conn=(LimitConn("c", 1),)),
        Location("five", limit_conn=(LimitConn("c", 5),)),
        Location("dry", limit_conn=(LimitConn("c", 1),), dry_run=True),
        Location("c2", limit_conn=(LimitConn("c2", 1),)),
        Location("both", limit_conn=(LimitConn("c", 5), LimitConn("c2", 1))),
        Location("s429", limit_conn=(LimitConn("c", 1),), limit_conn_status=429),
        Location("rc", (LimitReq("r", burst=5),), (LimitConn("c", 1),)),
    ),
    (
        # V10 / limit_conn.t / limit_conn_dry_run.t
        req(0, "one", hold=1200, k="u", note="holds c:u until ~1200"),
        req(0, "c2", hold=1200, k="v", note="holds c2:v until ~1200"),
        req(200, "one", k="u", note="503 REJECTED"),
        req(300, "five", k="u", note="1 < 5: PASSED"),
        req(400, "dry", hold=1400, k="u", note="200 REJECTED_DRY_RUN, holds no slot"),
        req(500, "one", k="other", note="another key: PASSED"),
        req(600, "both", k="v", note="c2 full: 503, and c:v is given back"),
        req(700, "one", k="v", note="c:v was rolled back: PASSED"),
        req(800, "s429", k="u", note="limit_conn_status 429"),
        req(1500, "one", k="u", note="holder done, dry-run request holds nothing: PASSED"),
        req(1600, "both", k="v", note="c2:v released: PASSED"),
        # a request delayed by limit_req takes its limit_conn slot only after the delay
        req(0, "rc", k="x"),
        req(100, "rc", hold=600, k="x", note="delayed 400 ms, then holds c:x until ~1100"),
        req(200, "one", k="x", note="the delayed request holds nothing yet: PASSED"),
        req(800, "one", k="x", note="now it does: 503"),
    ),
    doc="limit_conn: slot held by a slow request, max 5 vs 1, dry run, rollback, release, after a delay",
)

BOUNDARY = Scenario(
    "boundary",
    (ReqZone("one", "$arg_k", "2r/s"),),
    (Location("a", (LimitReq("one", nodelay=True),)),),
    (
        req(0, "a", k="a"),
        req(500, "a", k="a", note="exactly at the boundary: either outcome"),
        req(0, "a", k="b"),
        req(480, "a", k="b", note="20 ms before the boundary: within 2J, either outcome"),
        req(0, "a", k="c"),
        req(300, "a", k="c", note="clearly early: rejected"),
        req(800, "a", k="c", note="the rejection was not charged: passed"),
    ),
    doc="requests placed on purpose within the jitter of a decision boundary",
)

ALL = [
    BURST_DELAY,
    NODELAY,
    PER_MINUTE,
    TRUNCATION,
    TWO_ZONES,
    SEVERAL_LIMITS,
    AGAIN_PATH,
    CLIENT_ADDRESS,
    DRY_RUN,
    LIMIT_CONN,
    BOUNDARY,
]
