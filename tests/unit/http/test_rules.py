"""Guard rules (nginx's ``if (...) { return ...; }``): the condition table, parse errors with
file, line and key, and the compiled plan's order (server rules, then route rules, then return)."""

from __future__ import annotations

import pytest

from gateway.errors import ConfigErrors
from gateway.http.context import RequestContext
from gateway.http.rules import compile_condition, first_answer, parse_condition
from gateway.plan import load_config_text
from tests.support.importing import request_context as context


def holds(condition: str, ctx: RequestContext) -> bool:
    return compile_condition(parse_condition(condition))(ctx)


UA = {"User-Agent": "Mozilla/5.0 (compatible; Googlebot/2.1)"}


@pytest.mark.parametrize(
    ("condition", "method", "target", "headers", "expected"),
    [
        # a variable alone: false when empty or "0"
        ("$http_x_flag", "GET", "/", {}, False),
        ("$http_x_flag", "GET", "/", {"X-Flag": "0"}, False),
        ("$http_x_flag", "GET", "/", {"X-Flag": "00"}, True),
        ("$http_x_flag", "GET", "/", {"X-Flag": "no"}, True),
        ("$arg_debug", "GET", "/?debug=1", {}, True),
        ("($arg_debug)", "GET", "/?debug=", {}, False),
        # = and !=: string comparison, case-sensitive, quotes taken off
        ("$request_method = POST", "POST", "/", {}, True),
        ("$request_method = post", "POST", "/", {}, False),
        ("$request_method = 'OPTIONS'", "OPTIONS", "/", {}, True),
        ('($request_method = "OPTIONS")', "GET", "/", {}, False),
        ("$request_method != GET", "POST", "/", {}, True),
        ("$request_method != GET", "GET", "/", {}, False),
        ('$http_referer = ""', "GET", "/", {}, True),
        ('$http_referer != ""', "GET", "/", {"Referer": "x"}, True),
        ("$http_x_a = $http_x_b", "GET", "/", {"X-A": "1", "X-B": "1"}, True),
        ("$http_x_a = $http_x_b", "GET", "/", {"X-A": "1", "X-B": "2"}, False),
        ("$http_x_a = v$arg_n", "GET", "/?n=2", {"X-A": "v2"}, True),
        # ~ and ~*: a search, not a full match; !~ and !~* negate
        ("$request_method !~ ^(GET|HEAD|POST)$", "GET", "/", {}, False),
        ("$request_method !~ ^(GET|HEAD|POST)$", "DELETE", "/", {}, True),
        ("$request_method !~ ^(GET|HEAD|POST)$", "GETX", "/", {}, True),
        ('$request_uri ~ "/\\.git"', "GET", "/repo/.git/config", {}, True),
        ('$request_uri ~ "/\\.git"', "GET", "/repo/git", {}, False),
        ("$uri ~ \\.php$", "GET", "/index.php", {}, True),
        ("$uri ~ \\.PHP$", "GET", "/index.php", {}, False),
        ("$uri ~* \\.PHP$", "GET", "/index.php", {}, True),
        ('$http_user_agent ~* "(bot|spider)"', "GET", "/", UA, True),
        ('$http_user_agent ~ "(bot|spider)"', "GET", "/", UA, True),
        ('$http_user_agent ~ "(Bot|Spider)"', "GET", "/", {"User-Agent": "googlebot"}, False),
        ('$http_user_agent !~* "(bot|spider)"', "GET", "/", UA, False),
        ("$http_user_agent !~* (bot|spider)", "GET", "/", {}, True),
        ("$http_user_agent ~ ^$", "GET", "/", {}, True),
        ("$host ~ ^(?<sub>[a-z]+)\\.example\\.com$", "GET", "/", {"Host": "api.example.com"}, True),
        ("$http_x_forwarded_proto != https", "GET", "/", {"X-Forwarded-Proto": "https"}, False),
        ("$scheme = http", "GET", "/", {}, True),
    ],
)
def test_condition_table(condition, method, target, headers, expected):
    assert holds(condition, context(method, target, headers)) is expected


@pytest.mark.parametrize(
    ("condition", "message"),
    [
        ("-f $request_filename", "file tests"),
        ("!-e $uri", "file tests"),
        ("$request_method=POST", "put spaces around the operator"),
        ("request_method = POST", "starts with a variable"),
        ("$request_method == POST", 'unknown operator "=="'),
        ("$request_method =", 'nothing after "="'),
        ("$uri ~ ''", "empty regular expression"),
        ("$uri ~ (unclosed", "invalid regular expression"),
        ("$no_such_thing", 'unknown "no_such_thing" variable'),
        ("$uri = $no_such_thing", 'unknown "no_such_thing" variable'),
        ("", "expected a condition"),
    ],
)
def test_bad_conditions_say_why(condition, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        parse_condition(condition)


BASE = "upstreams: {app: {servers: [127.0.0.1:9]}}\nadmin: {listen: 'off'}\n"


def test_config_errors_name_file_line_and_key():
    text = BASE + (
        "rules:\n"
        "  - {if: '$request_method == POST', return: 405}\n"
        "routes:\n"
        "  - location: /\n"
        "    upstream: app\n"
        "    rules:\n"
        "      - {if: '$uri ~ (x', return: {code: 403}}\n"
        "      - {if: '$uri', return: {code: 301}}\n"
        "      - {if: '$uri', return: {code: 403}, then: x}\n"
    )
    with pytest.raises(ConfigErrors) as info:
        load_config_text(text, "guards.yaml")
    shown = str(info.value)
    assert 'guards.yaml:4:10: rules[0].if: unknown operator "=="' in shown, shown
    assert "guards.yaml:9:14: routes[0].rules[0].if: invalid regular expression" in shown, shown
    assert "guards.yaml:10:30: routes[0].rules[1].return: a 301 return needs a url" in shown, shown
    assert "guards.yaml:11:43: routes[0].rules[2].then: unknown key 'then'" in shown, shown


def test_top_level_rules_with_servers_are_refused():
    text = BASE + ("rules: [{if: '$uri', return: 403}]\nservers:\n  - routes: [{location: /, upstream: app}]\n")
    with pytest.raises(ConfigErrors, match="rules go in each server"):
        load_config_text(text)


def test_plan_keeps_server_and_route_rules_in_order_and_routes_without_rules_pay_nothing():
    text = BASE + (
        "servers:\n"
        "  - server_name: a.example\n"
        "    rules:\n"
        "      - {if: '$request_method !~ ^(GET|HEAD|POST)$', return: 405}\n"
        "      - {if: '$http_user_agent ~* scanner', return: 444}\n"
        "    routes:\n"
        "      - location: /admin/\n"
        "        upstream: app\n"
        "        rules:\n"
        "          - {if: '$arg_token = \"\"', return: {code: 403, text: no token}}\n"
        "          - {if: '$http_x_old', return: {code: 301, url: 'https://new.example$request_uri'}}\n"
        "      - {location: /, upstream: app}\n"
        "      - location: /gone\n"
        "        return: 410\n"
        "        rules: [{if: $arg_x, return: 200}]\n"
    )
    config = load_config_text(text)
    server = config.servers[0]
    assert [r.condition for r in server.rules] == [
        "$request_method !~ ^(GET|HEAD|POST)$",
        "$http_user_agent ~* scanner",
    ]
    assert [r.ret.code for r in server.rules] == [405, 444]
    admin, root, gone = server.routes
    assert admin.answers and not root.answers and gone.answers
    assert root.rules == () and root.ret is None
    assert first_answer(server.rules, context("DELETE")).code == 405  # type: ignore[union-attr]
    assert first_answer(server.rules, context("GET", headers={"User-Agent": "Scanner/1"})).code == 444  # type: ignore[union-attr]
    assert first_answer(server.rules, context("GET")) is None
    ret = first_answer(admin.rules, context("GET", "/admin/x"))
    assert ret is not None and ret.code == 403 and ret.text is not None
    ctx = context("GET", "/admin/x?token=t", {"X-Old": "1"})
    ret = first_answer(admin.rules, ctx)
    assert ret is not None and ret.code == 301 and ret.url is not None
    assert ret.url(ctx) == "https://new.example/admin/x?token=t"
    assert first_answer(gone.rules, context("GET", "/gone?x=1")).code == 200  # type: ignore[union-attr]
    assert first_answer(gone.rules, context("GET", "/gone")) is None and gone.ret is not None


def test_map_and_geo_variables_in_rules_and_their_returns():
    # the bot-blocker idiom: map $http_user_agent $bad_bot {...}; if ($bad_bot) { return 403; }
    text = BASE + (
        "maps:\n"
        "  bad_bot:\n"
        "    source: $http_user_agent\n"
        '    default: "0"\n'
        '    values: {"~*(sqlmap|nikto)": "1", "~*(?<name>masscan)": "$name"}\n'
        "  why: {source: $bad_bot, default: other, values: {'1': scanner}}\n"
        "geo:\n"
        '  inside: {default: "0", values: {192.0.2.0/24: "1"}}\n'
        "rules:\n"
        "  - {if: $bad_bot, return: {code: 403, text: 'no $why'}}\n"
        "routes:\n"
        "  - location: /\n"
        "    upstream: app\n"
        "    rules: [{if: '$inside = 1', return: {code: 302, url: 'https://in.example$request_uri'}}]\n"
    )
    config = load_config_text(text)
    server = config.servers[0]
    ctx = context("GET", "/", {"User-Agent": "sqlmap/1.5"})
    ret = first_answer(server.rules, ctx)
    assert ret is not None and ret.code == 403 and ret.text is not None and ret.text(ctx) == "no scanner"
    ctx = context("GET", "/", {"User-Agent": "MASSCAN/1"})
    ret = first_answer(server.rules, ctx)
    assert ret is not None and ret.text is not None and ret.text(ctx) == "no other"
    assert first_answer(server.rules, context("GET", "/", {"User-Agent": "Mozilla/5.0"})) is None
    ctx = context("GET", "/a?b=1")  # the context's client is 192.0.2.7
    ret = first_answer(server.routes[0].rules, ctx)
    assert ret is not None and ret.url is not None and ret.url(ctx) == "https://in.example/a?b=1"


def test_a_map_that_can_hold_raw_address_bytes_is_refused_in_a_condition():
    text = BASE + (
        "maps: {k: {source: $request_method, values: {POST: $binary_remote_addr}}}\n"
        "rules: [{if: $k, return: 403}]\n"
        "routes: [{location: /, upstream: app}]\n"
    )
    with pytest.raises(ConfigErrors, match="raw bytes"):
        load_config_text(text)
