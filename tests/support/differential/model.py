"""An independent model of nginx's limit_req + limit_conn, and the jitter analysis built on it.

Written from ngx_http_limit_req_module.c / ngx_http_limit_conn_module.c as described in
limit-semantics.md §1-§2 (it does not import ``gateway``, so it cross-checks it):

limit_req, per request, at the cached integer-ms clock ``now``:
    walk the location's limits in order, skipping empty keys;
    node present:  ms = now - last (ms < -60000 -> 1, ms < 0 -> 0)
                   excess = max(0, excess - rate_m * ms // 1000 + 1000)
                   excess > burst_m -> BUSY (nothing written; earlier limits not charged)
                   last limit       -> commit excess, last = now if ms != 0 -> OK
                   otherwise        -> AGAIN (committed later)
    node absent:   last limit -> node (0, now), OK with excess 0; otherwise node (0, 0), AGAIN
    then delay = max over the decisive limit and, in reverse order, every AGAIN limit
    (re-leaked at ``now`` and committed): (excess - delay_m) * 1000 // rate_m when excess > delay_m.
limit_conn (after limit_req, i.e. after the delay): for each limit with a key, a key at ``max``
    rejects and gives back the slots this request already took; otherwise count += 1 until the
    request ends.

``simulate`` replays a schedule as a discrete-event simulation; ``analyse`` replays it under
many clock perturbations and reports, per request, every outcome the model allows.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from tests.support.differential.scenario import ConnZone, Location, ReqZone, Scenario, eval_key

T0 = 10**9  # nginx's clock is CLOCK_MONOTONIC in ms: far from 0 (matters for AGAIN nodes created with last=0)

NODELAY_M = (2**63 - 1) // 1000 * 1000

# $limit_req_status / $limit_conn_status values; "" = not found
PASSED, DELAYED, REJECTED = "PASSED", "DELAYED", "REJECTED"
DELAYED_DRY_RUN, REJECTED_DRY_RUN = "DELAYED_DRY_RUN", "REJECTED_DRY_RUN"

# canonical order inside a group of interchangeable requests
REQ_RANK = {"": 0, PASSED: 1, DELAYED: 2, DELAYED_DRY_RUN: 3, REJECTED_DRY_RUN: 4, REJECTED: 5}
CONN_RANK = {"": 0, PASSED: 1, REJECTED_DRY_RUN: 2, REJECTED: 3}


@dataclass
class Outcome:
    status: int
    limit_req_status: str
    limit_conn_status: str
    duration_ms: int  # modelled latency: real delay + time spent upstream (0 for rejections)
    excess: int | None  # excess in the "limiting requests"/"delaying request" log line, if any

    @property
    def key(self) -> tuple[int, str, str]:
        return (self.status, self.limit_req_status, self.limit_conn_status)


def sort_key(status: tuple[int, str, str], excess: int | None, duration: float) -> tuple[object, ...]:
    return (REQ_RANK[status[1]], CONN_RANK[status[2]], status[0], -1 if excess is None else excess, duration)


# -- limit_req -----------------------------------------------------------------------------------


@dataclass
class _Limit:
    zone: str
    rate_m: int
    burst_m: int
    delay_m: int


def _limits(scn: Scenario, loc: Location) -> list[_Limit]:
    out = []
    for lim in loc.limit_req:
        zone = scn.zone(lim.zone)
        assert isinstance(zone, ReqZone)
        delay_m = NODELAY_M if lim.nodelay else lim.delay * 1000
        out.append(_Limit(lim.zone, zone.rate_m, lim.burst * 1000, delay_m))
    return out


def _leak(node: list[int], now: int, rate_m: int) -> tuple[int, int]:
    ms = now - node[1]
    if ms < -60000:
        ms = 1
    elif ms < 0:
        ms = 0
    excess = node[0] - rate_m * ms // 1000 + 1000
    return max(excess, 0), ms


def limit_req(
    state: dict[tuple[str, str], list[int]], limits: list[_Limit], keys: list[str], now: int
) -> tuple[str, int, int | None]:
    """One request through a location's limit_req list: (result, delay_ms, logged excess).

    result: "" (no key: not limited), "OK" or "BUSY".
    """
    pending: list[int] = []
    rc = ""
    excess = 0
    decisive = len(limits) - 1
    for n, lim in enumerate(limits):
        key = keys[n]
        if not key:
            continue
        decisive = n
        is_last = n == len(limits) - 1
        node = state.get((lim.zone, key))
        if node is None:
            if is_last:
                state[(lim.zone, key)] = [0, now]
                rc, excess = "OK", 0
                break
            state[(lim.zone, key)] = [0, 0]
            pending.append(n)
            rc = "AGAIN"
            continue
        excess, ms = _leak(node, now, lim.rate_m)
        if excess > lim.burst_m:
            return "BUSY", 0, excess
        if is_last:
            node[0] = excess
            if ms:
                node[1] = now
            rc = "OK"
            break
        pending.append(n)
        rc = "AGAIN"
    if rc == "":
        return "", 0, None
    if rc == "AGAIN":
        excess = 0
        decisive = len(limits) - 1
    lim = limits[decisive]
    max_delay = 0 if excess <= lim.delay_m else (excess - lim.delay_m) * 1000 // lim.rate_m
    for j in reversed(pending):
        lim = limits[j]
        node = state[(lim.zone, keys[j])]
        e, ms = _leak(node, now, lim.rate_m)
        node[0] = e
        if ms:
            node[1] = now
        if e <= lim.delay_m:
            continue
        d = (e - lim.delay_m) * 1000 // lim.rate_m
        if d > max_delay:
            max_delay = d
            excess = e
    return "OK", max_delay, (excess if max_delay else None)


# -- the whole request path ----------------------------------------------------------------------


def simulate(scn: Scenario, arrivals: list[int], upstream_ms: list[int], order: list[float]) -> list[Outcome]:
    """Replay ``scn.requests`` arriving at ``arrivals`` (clock ms).

    ``upstream_ms[i]``: extra time request i spends beyond its ``hold`` before its limit_conn slot
    is released; ``order[i]``: tie-break between events of the same millisecond.
    """
    reqs = scn.requests
    req_state: dict[tuple[str, str], list[int]] = {}
    conn_state: dict[tuple[str, str], int] = {}
    outcomes: list[Outcome | None] = [None] * len(reqs)
    delays = [0] * len(reqs)
    taken: list[list[tuple[str, str]]] = [[] for _ in reqs]
    events: list[tuple[int, float, int, str, int]] = []
    seq = 0

    def push(at: int, kind: str, i: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (at, order[i], seq, kind, i))

    for i, t in enumerate(arrivals):
        push(t, "arrive", i)

    lreq_status = [""] * len(reqs)
    excesses: list[int | None] = [None] * len(reqs)

    while events:
        now, _, _, kind, i = heapq.heappop(events)
        r = reqs[i]
        loc = scn.location(r.loc)
        args = dict(r.args)
        if kind == "arrive":
            limits = _limits(scn, loc)
            keys = [eval_key(scn.zone(lim.zone).key, args) for lim in loc.limit_req]
            rc, delay, excess = limit_req(req_state, limits, keys, now)
            excesses[i] = excess
            if rc == "BUSY":
                lreq_status[i] = REJECTED_DRY_RUN if loc.dry_run else REJECTED
                if not loc.dry_run:
                    outcomes[i] = Outcome(loc.limit_req_status, REJECTED, "", 0, excess)
                    continue
            elif rc == "OK":
                if delay:
                    lreq_status[i] = DELAYED_DRY_RUN if loc.dry_run else DELAYED
                else:
                    lreq_status[i] = PASSED
            if rc == "OK" and delay and not loc.dry_run:
                delays[i] = delay
                push(now + delay, "conn", i)
                continue
            kind = "conn"  # limit_conn runs in the same phase pass
        if kind == "conn":
            conn_status = ""
            rejected = False
            for lim in loc.limit_conn:
                zone = scn.zone(lim.zone)
                assert isinstance(zone, ConnZone)
                key = eval_key(zone.key, args)
                if not key:
                    continue
                conn_status = PASSED
                count = conn_state.get((lim.zone, key), 0)
                if count >= lim.max:
                    for slot in taken[i]:
                        conn_state[slot] -= 1
                    taken[i] = []
                    conn_status = REJECTED_DRY_RUN if loc.dry_run else REJECTED
                    rejected = not loc.dry_run
                    break
                conn_state[(lim.zone, key)] = count + 1
                taken[i].append((lim.zone, key))
            if rejected:
                outcomes[i] = Outcome(loc.limit_conn_status, lreq_status[i], conn_status, delays[i], excesses[i])
                continue
            outcomes[i] = Outcome(200, lreq_status[i], conn_status, delays[i] + r.hold, excesses[i])
            push(now + r.hold + upstream_ms[i], "release", i)
        elif kind == "release":
            for slot in taken[i]:
                conn_state[slot] -= 1
            taken[i] = []
    assert all(o is not None for o in outcomes)
    return outcomes  # type: ignore[return-value]


def groups(scn: Scenario) -> list[list[int]]:
    """Indices of interchangeable requests (same time, location, args, hold), in schedule order."""
    by_key: dict[tuple[object, ...], list[int]] = {}
    for i, r in enumerate(scn.requests):
        by_key.setdefault(r.group_key(), []).append(i)
    return list(by_key.values())


def canonical(scn: Scenario, items: list[tuple[tuple[int, str, str], int | None, float]]) -> list[int]:
    """A permutation ``p``: position i of the canonical order holds item ``p[i]``.

    Inside a group of interchangeable requests, which one arrives first is not part of the
    schedule: the group's outcomes are sorted (status class, logged excess, latency) and given
    to the group's positions in schedule order. Observed results get the same treatment.
    """
    perm = list(range(len(items)))
    for members in groups(scn):
        if len(members) < 2:
            continue
        ranked = sorted(members, key=lambda i: sort_key(*items[i]))
        for pos, src in zip(members, ranked, strict=True):
            perm[pos] = src
    return perm


# -- jitter ---------------------------------------------------------------------------------------


@dataclass
class Possible:
    """What the model allows for one request (canonical position) under jitter, per outcome."""

    count: int = 0
    duration: tuple[int, int] = (10**12, -(10**12))
    excess: tuple[int, int] | None = None
    excess_missing: bool = False  # some runs give this outcome without a log line

    def add(self, o: Outcome) -> None:
        self.count += 1
        self.duration = (min(self.duration[0], o.duration_ms), max(self.duration[1], o.duration_ms))
        if o.excess is None:
            self.excess_missing = True
        elif self.excess is None:
            self.excess = (o.excess, o.excess)
        else:
            self.excess = (min(self.excess[0], o.excess), max(self.excess[1], o.excess))


@dataclass
class Analysis:
    jitter_ms: int
    runs: int
    nominal: list[Outcome]
    possible: list[dict[tuple[int, str, str], Possible]] = field(default_factory=list)

    def sensitive(self, i: int) -> bool:
        return len(self.possible[i]) > 1


def perturbations(n: int, jitter: int, rng: random.Random, randoms: int) -> list[list[int]]:
    """Clock errors per request: nominal, single extremes, opposite pairs, then random draws.

    Exhaustive enumeration of (2J+1)^n is out of reach; decisions flip on *differences*
    between arrival times, so every pair pushed to opposite extremes is included, plus
    random vectors whose components are extreme with probability 1/2 (the boundary cases)
    and uniform otherwise.
    """
    out = [[0] * n]
    for i in range(n):
        for sign in (-1, 1):
            e = [0] * n
            e[i] = sign * jitter
            out.append(e)
    for i in range(n):
        for j in range(n):
            if i != j:
                e = [0] * n
                e[i], e[j] = -jitter, jitter
                out.append(e)
    for _ in range(randoms):
        out.append(
            [rng.choice((-jitter, jitter)) if rng.random() < 0.5 else rng.randint(-jitter, jitter) for _ in range(n)]
        )
    return out


def analyse(scn: Scenario, jitter_ms: int, randoms: int = 400, seed: int = 1) -> Analysis:
    """Run the model at the nominal times and under every perturbation of up to ±jitter_ms.

    The upstream time (how long after its ``hold`` a request keeps its limit_conn slot) is
    drawn from [1, jitter_ms]; same-millisecond events are ordered at random (nginx's cached
    clock makes "simultaneous" requests share one ``now`` in either order).
    """
    rng = random.Random(seed)
    n = len(scn.requests)
    nominal_times = [T0 + r.t for r in scn.requests]
    nominal = simulate(scn, nominal_times, [1] * n, [float(i) for i in range(n)])
    analysis = Analysis(jitter_ms, 0, nominal, [{} for _ in range(n)])
    for k, errors in enumerate(perturbations(n, jitter_ms, rng, randoms)):
        arrivals = [t + e for t, e in zip(nominal_times, errors, strict=True)]
        upstream = [1 if k == 0 else rng.randint(1, max(1, jitter_ms)) for _ in range(n)]
        order = [float(i) if k == 0 else rng.random() for i in range(n)]
        outs = simulate(scn, arrivals, upstream, order)
        perm = canonical(scn, [(o.key, o.excess, o.duration_ms) for o in outs])
        for pos, src in enumerate(perm):
            o = outs[src]
            analysis.possible[pos].setdefault(o.key, Possible()).add(o)
        analysis.runs += 1
    return analysis
