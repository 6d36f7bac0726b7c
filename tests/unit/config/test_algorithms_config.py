"""Configuration of the newer zone types: what loads, and what is refused with a message."""

from __future__ import annotations

import pytest

from gateway.errors import ConfigErrors
from gateway.plan import load_config_text
from tests.support.config import config

ZONES = """  r: {type: req, key: $binary_remote_addr, rate: 1r/s}
  c: {type: conn, key: $binary_remote_addr}"""


def cfg(zone: str, use: str = "{zone: z}") -> str:
    routes = f"  - {{location: /, upstream: app, limits: [{use}]}}"
    return config("127.0.0.1:9", zones=f"  z: {zone}\n{ZONES}", routes=routes)(8080)


def test_limits_list_feeds_every_kind_in_order():
    config = load_config_text(
        cfg("{type: gcra, key: $arg_k, rate: 10r/h, burst: 3}", "{zone: r, burst: 2}, {zone: z}, {zone: c, max: 4}")
    )
    route = config.routes[0]
    assert [lim.zone for lim in route.limit_req] == ["r"] and route.limit_req[0].burst_m == 2000
    assert [(lim.zone, lim.max) for lim in route.limit_conn] == [("c", 4)]
    assert route.limit_algo[0].params.emission_ns == 360 * 10**9
    assert route.ratelimit_policy == '"r";q=1;w=1, "c";q=4;qu="concurrent-requests", "z";q=4;w=1440'


@pytest.mark.parametrize(
    ("zone", "use", "message"),
    [
        ("{type: gcra, key: $arg_k, rate: 0r/s}", "{zone: z}", "invalid rate"),
        ("{type: gcra, key: $arg_k, rate: 5r/w}", "{zone: z}", "invalid rate"),
        ("{type: gcra, key: $arg_k, rate: 2000000r/s}", "{zone: z}", "at most 1000000r/s"),
        ("{type: gcra, key: $arg_k, rate: 1r/d, burst: 200}", "{zone: z}", "104 days"),
        ("{type: gcra, key: $arg_k, rate: 1r/s, cost: -3}", "{zone: z}", "invalid cost"),
        ("{type: gcra, key: $arg_k, rate: 1r/s, cost: $nope}", "{zone: z}", "unknown"),
        ("{type: gcra, key: $arg_k, rate: 1r/s}", "{zone: z, burst: 3}", "burst"),
        ("{type: sliding_log, key: $arg_k, limit: 1000000, window: 1s}", "{zone: z}", "limit"),
        ("{type: sliding_log, key: $arg_k, window: 1s}", "{zone: z}", "limit"),
        ("{type: count, key: $arg_k, limit: 5, window: 1s, window_type: rolling}", "{zone: z}", "window_type"),
        ("{type: token, key: $arg_k, rate: 1r/s, warmup: 2d}", "{zone: z}", "warmup is at most 1d"),
        ("{type: token, key: $arg_k, rate: 1r/s}", "{zone: nope}", 'unknown zone "nope"'),
        ("{type: token, key: $arg_k, rate: 1r/s}", "{zone: c}", "max"),
        ("{type: token, key: $arg_k, rate: 1r/s}", "{zone: z}, {zone: z}", "used twice"),
        ("{type: token, key: $arg_k, rate: 1r/s}", "just-a-name", "expected a mapping"),
        ("{type: token, key: $arg_k, rate: 1r/s}", "{zone: z}], limit_req: [{zone: r}], x: [", "unknown key"),
        ("{type: token, key: $arg_k, rate: 1r/s}", "{zone: r}], limit_req: [{zone: r}", "also in a limit_*"),
    ],
)
def test_bad_zone_or_use_is_an_error_with_a_message(zone, use, message):
    with pytest.raises(ConfigErrors) as info:
        load_config_text(cfg(zone, use))
    assert message in str(info.value)


def test_reload_from_fixed_to_sliding_window_starts_the_zone_afresh():
    from gateway.store.memory import MemoryStore

    def load(window_type: str):
        return load_config_text(
            "zones:\n  q: {type: count, key: $arg_k, limit: 2, window: 1h, window_type: " + window_type + "}\n"
            "upstreams: {app: {servers: [127.0.0.1:9]}}\nroutes:\n  - {location: /, upstream: app, limits: [{zone: q}]}\n"
        )

    store = MemoryStore(clock_ms=lambda: 10**9)
    fixed = load("fixed")
    store.configure(fixed.spec.zones)
    for _ in range(2):
        store.decide(fixed.routes[0], [], [b"k"], [])
    sliding = load("sliding")
    store.configure(sliding.spec.zones)
    verdict = store.decide(sliding.routes[0], [], [b"k"], [])
    assert verdict.count_rejected == -1 and verdict.count_used == [1]  # not the fixed window's packed int
