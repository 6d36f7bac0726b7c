"""resty_req.delay_ms: the wait of a lua-resty-redis-ratelimit node, from the reply's integer excess.

The library returns ``excess / rate_m`` seconds (the excess Redis truncated to an integer) and
``ngx.sleep`` waits ``(ngx_int_t) (seconds * 1000)`` ms. Both steps are in double arithmetic,
so the result is sometimes 1 ms below the exact quotient; nginx's integer rule is not it.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from gateway.limits import nginx_req, resty_req
from gateway.limits.params import ReqParams

RATES = {"1r/s": 1000, "2r/s": 2000, "3r/s": 3000, "7r/s": 7000, "1r/m": 16, "3r/m": 50, "7r/m": 116, "100r/m": 1666}


def test_the_library_divides_the_truncated_excess_in_double_arithmetic():
    # 3r/m: 201 / 50 = 4.0199999999999996 s, and ngx.sleep truncates 4019.9999999999995 ms
    assert resty_req.delay_ms(201, 50) == 4019
    assert 201 * 1000 // 50 == 4020
    # 1r/m: the excess 999.984 is replied as 999: 999 / 16 s = 62437.5 ms, truncated
    assert resty_req.delay_ms(resty_req.reply_integer(999.984), 16) == 62437
    # 3r/s: one request waiting is 333 ms, two 666 ms
    assert [resty_req.delay_ms(e, 3000) for e in (0, 1000, 2000, 3000)] == [0, 333, 666, 1000]
    # 7r/m: 1000 / 116 s = 8620.69 ms
    assert resty_req.delay_ms(1000, 116) == 8620


@pytest.mark.parametrize("rate", sorted(RATES))
def test_never_above_the_exact_quotient_and_at_most_one_ms_below(rate):
    rate_m = RATES[rate]
    for excess in range(0, 20_001):
        got = resty_req.delay_ms(excess, rate_m)
        exact = math.floor(Fraction(excess * 1000, rate_m))
        assert exact - 1 <= got <= exact, (excess, rate_m)
        assert got == int(excess / rate_m * 1000)  # the library's expression, as Python evaluates it


def test_the_delay_threshold_counts_from_the_truncated_excess():
    assert resty_req.delay_ms(1000, 500, delay_m=1000) == 0  # at the threshold: no wait
    assert resty_req.delay_ms(2000, 500, delay_m=1000) == 2000  # V3: (2000 - 1000) / 500 s
    assert resty_req.delay_ms(1201, 50, delay_m=1000) == 4019  # (1201 - 1000) / 50 s in doubles
    assert resty_req.delay_ms(10**9, 1000, delay_m=2**53) == 0  # nodelay


def test_the_embedded_store_keeps_nginx_integer_rule():
    params = ReqParams(zone="z", rate_m=50, burst_m=5000, delay_m=0)
    assert nginx_req.delay_of(201, params) == 4020  # nginx: 201 * 1000 // 50
    assert resty_req.delay_ms(201, 50) == 4019
