"""The comparison itself (no nginx needed): what counts as a difference when the test
machine stalls longer than the scenario's jitter."""

from __future__ import annotations

from tests.support.differential.harness import Observed, compare, excess_slack
from tests.support.differential.model import analyse
from tests.support.differential.scenarios import BOUNDARY


def _as_modelled(analysis, i: int) -> Observed:
    """An observation the model allows for request ``i``: its first outcome, at its least duration."""
    key, possible = next(iter(analysis.possible[i].items()))
    status, req_status, conn_status = key
    excess = possible.excess[0] if possible.excess is not None else None
    return Observed(status, req_status, conn_status, float(possible.duration[0]), excess=excess)


ANALYSIS = analyse(BOUNDARY, 91)
TARGET = next(
    i for i in range(len(BOUNDARY.requests)) if any(p.excess is not None for p in ANALYSIS.possible[i].values())
)


def _excess_errors(nginx_excess: int, gateway_excess: int, loop_lag_ms: float = 0.0) -> list[str]:
    analysis, target = ANALYSIS, TARGET
    nginx = [_as_modelled(analysis, i) for i in range(len(BOUNDARY.requests))]
    gateway = [_as_modelled(analysis, i) for i in range(len(BOUNDARY.requests))]
    key, possible = next((k, p) for k, p in analysis.possible[target].items() if p.excess is not None)
    for obs, excess in ((nginx, nginx_excess), (gateway, gateway_excess)):
        obs[target] = Observed(*key, float(possible.duration[0]), excess=excess)
    result = compare(BOUNDARY, analysis, nginx, gateway, {"nginx": 0.0, "gateway": 0.0}, loop_lag_ms)
    return [e for e in result.errors if "logged excess" in e]


def test_an_excess_outside_the_model_is_an_error_unless_nginx_logged_the_same():
    # the gateway alone outside the model: an error
    assert _excess_errors(nginx_excess=100, gateway_excess=2)
    # both outside and in agreement (the machine stalled; nginx is the reference): none
    assert _excess_errors(nginx_excess=2, gateway_excess=2) == []
    # both outside, far apart: errors for both
    assert len(_excess_errors(nginx_excess=2, gateway_excess=5000)) == 2


def test_a_measured_stall_widens_the_excess_window_by_what_it_is_worth_at_the_zones_rate():
    (lo, hi) = next(p.excess for p in ANALYSIS.possible[TARGET].values() if p.excess is not None)
    inside = (lo + hi) // 2
    # 4 milli-requests above the model: an error when the client loop did not stall
    assert _excess_errors(nginx_excess=inside, gateway_excess=hi + 4)
    # a 200 ms stall is worth ceil(200 * rate_m / 1000) of excess at the location's rate
    slack = excess_slack(BOUNDARY, BOUNDARY.requests[TARGET].loc, 200.0)
    assert slack >= 4
    assert _excess_errors(nginx_excess=inside, gateway_excess=hi + 4, loop_lag_ms=200.0) == []
    assert _excess_errors(nginx_excess=inside, gateway_excess=lo - slack, loop_lag_ms=200.0) == []
    # but not one milli-request beyond it, on either side
    assert _excess_errors(nginx_excess=inside, gateway_excess=hi + slack + 1, loop_lag_ms=200.0)
    assert _excess_errors(nginx_excess=inside, gateway_excess=lo - slack - 1, loop_lag_ms=200.0)
