"""The gateway's limits against the real nginx, request by request.

Every scenario of scenarios.py is replayed at once against nginx and the gateway (see
conftest.py); a test fails when either target does something the model does not allow at
the scenario's clock jitter, or when the two disagree on a request that is not
boundary-sensitive. The failure message is the full per-request table (model, nginx, gateway).
"""

from __future__ import annotations

import re

import pytest

from tests.support.differential.harness import Run, default_jitter
from tests.support.differential.model import analyse
from tests.support.differential.scenarios import ALL, BOUNDARY

# A scenario where the gateway is known to differ from nginx gets
# pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=...)) here.
CASES = [pytest.param(s.name, id=s.name) for s in ALL]


@pytest.mark.timing
@pytest.mark.parametrize("name", CASES)
def test_gateway_decides_like_nginx(name: str, differential: Run) -> None:
    comparison = differential.comparisons[name]
    if comparison.errors:
        pytest.fail(comparison.report(), pytrace=False)


def test_no_crash_or_alert_on_either_side(differential: Run) -> None:
    assert not re.search(r"\[(alert|crit|emerg)\]", differential.nginx_error_log), differential.nginx_error_log
    assert "Traceback" not in differential.gateway_stderr, differential.gateway_stderr
    assert not re.search(r"\[(alert|crit|emerg)\]", differential.gateway_stderr), differential.gateway_stderr


def test_scenarios_are_strict_except_on_purpose() -> None:
    """At the default jitter only the requests placed on a boundary on purpose may go either way."""
    jitter = default_jitter()
    boundary = analyse(BOUNDARY, jitter)
    assert [boundary.sensitive(i) for i in range(len(BOUNDARY.requests))] == [
        False,
        True,
        False,
        True,
        False,
        False,
        False,
    ]
    for scn in ALL:
        if scn is not BOUNDARY:
            analysis = analyse(scn, jitter)
            sensitive = [i for i in range(len(scn.requests)) if analysis.sensitive(i)]
            assert not sensitive, (scn.name, sensitive)
