"""``gateway replay`` with guard rules: a request a rule answers takes nothing from a zone, as in
the gateway (server rules before the route, route rules before the limits)."""

from __future__ import annotations

from gateway.plan import load_config_text
from gateway.replay.logread import Timing, line_parser, read_requests
from gateway.replay.simulate import Outcome, Simulator

TEMPLATE = '$remote_addr [$msec] "$request" $status'
CONFIG = """
admin: {listen: "off"}
upstreams: {app: {servers: ["127.0.0.1:9"]}}
zones:
  r: {type: req, key: $remote_addr, rate: 1r/m}
defaults:
  limit_req: [{zone: r}]
rules:
  - {if: '$request_method = DELETE', return: 405}
routes:
  - location: /
    upstream: app
    rules: [{if: '$arg_drop', return: 444}]
"""


def outcomes(lines: list[str]) -> list[Outcome]:
    parse, _ = line_parser(TEMPLATE)
    return list(Simulator(load_config_text(CONFIG)).run(read_requests(lines, parse, Timing())))


def test_requests_answered_by_rules_are_not_limited_and_do_not_count():
    t = 1_790_000_000
    lines = [
        f'10.0.0.1 [{t}.000] "DELETE /a HTTP/1.1" 405',
        f'10.0.0.1 [{t}.100] "GET /a?drop=1 HTTP/1.1" 444',
        f'10.0.0.1 [{t}.200] "GET /a HTTP/1.1" 200',
        f'10.0.0.1 [{t}.300] "GET /a HTTP/1.1" 503',
    ]
    got = [(o.route, o.limit_req_status) for o in outcomes(lines)]
    assert got == [("(rule)", ""), ("/", ""), ("/", "PASSED"), ("/", "REJECTED")]


def test_an_allow_deny_list_answers_403_after_the_limits_counted_the_request():
    config = CONFIG.replace(
        "    rules: [{if: '$arg_drop', return: 444}]", "    access: [{allow: 10.0.0.0/8}, {deny: all}]"
    )
    parse, _ = line_parser(TEMPLATE)
    t = 1_790_000_000
    lines = [
        f'10.0.0.1 [{t}.000] "GET /a HTTP/1.1" 200',
        f'192.0.2.1 [{t}.100] "GET /a HTTP/1.1" 403',
        f'192.0.2.1 [{t}.200] "GET /a HTTP/1.1" 503',  # counted by the zone first: the limit answers
    ]
    got = list(Simulator(load_config_text(config)).run(read_requests(lines, parse, Timing())))
    assert [(o.status, o.denied, o.limit_req_status) for o in got] == [
        (0, False, "PASSED"),
        (403, True, "PASSED"),
        (503, False, "REJECTED"),
    ]


def test_a_target_a_backend_would_read_elsewhere_is_a_bad_uri_and_takes_nothing():
    config = CONFIG.replace("  - location: /\n", "  - location: /admin\n    return: 403\n  - location: /\n")
    parse, _ = line_parser(TEMPLATE)
    t = 1_790_000_000
    lines = [
        f'10.0.0.1 [{t}.000] "GET /public/..;/admin HTTP/1.1" 400',  # Tomcat and Spring read /admin
        f'10.0.0.1 [{t}.100] "GET /a HTTP/1.1" 200',
    ]
    got = list(Simulator(load_config_text(config)).run(read_requests(lines, parse, Timing())))
    assert [(o.route, o.limit_req_status) for o in got] == [("(bad uri)", ""), ("/", "PASSED")]
