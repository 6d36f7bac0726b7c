"""nginx's regexes (PCRE) as Python reads them: POSIX classes translated, the constructs Python
would read differently escaped or refused, one translation for rules, map keys and locations."""

from __future__ import annotations

import warnings

import pytest

from gateway.errors import ConfigErrors
from gateway.http.pcre import compile_pcre, to_python
from gateway.http.routing import parse_location
from gateway.plan import load_config_text
from tests.support.importing import request_context as context

BASE = "listen: 127.0.0.1:8080\nadmin: {listen: 'off'}\nupstreams: {app: {servers: [127.0.0.1:9000]}}\n"


@pytest.mark.parametrize(
    ("pattern", "matches", "misses"),
    [
        ("^/[[:digit:]]+$", ["/123"], ["/12a", "/", "/:"]),
        ("^[[:alpha:]]+bot", ["Badbot"], ["1bot", "é bot"]),
        ("^[^[:space:]]+$", ["a-b"], ["a b", "a\tb", "a\x0bb"]),
        ("^[[:alpha:]_-]+$", ["a_b-c"], ["a1"]),
        ("^[[:alnum:][:punct:]]+$", ["a1!~"], ["a b"]),
        ("^[[:upper:]][[:lower:]]$", ["Ab"], ["AB", "ab"]),
        ("^[[:xdigit:]]+$", ["0aF"], ["g"]),
        ("^[[:word:]]+$", ["a_1"], ["a-1"]),
        ("^[[:blank:]]$", [" ", "\t"], ["\n"]),
        ("^[[:cntrl:]]$", ["\x00", "\x7f"], [" "]),
        ("^[[:graph:]]+$", ["!~"], [" "]),
        ("^[[:print:]]+$", ["a b"], ["\t"]),
        ("^[[:space:]-z]$", ["-", "z", " "], ["a"]),  # a '-' after a class is a literal, not a range
        ("^[[a]+$", ["[a["], ["b"]),  # a '[' in a class is a literal in PCRE
        ("^[a&&b]+$", ["a&b"], ["c"]),  # so is '&&' (a set operation Python reserves)
        ("^a\\v", ["a\n", "a\r", "a\x0b"], ["a "]),  # PCRE's \v: vertical white space
        ("a\\Z", ["xa", "xa\n"], ["xa\n\n"]),  # PCRE's \Z: also before a final newline
        ("^(?<d>[[:digit:]])(?'e'x)$", ["1x"], ["ax"]),
    ],
)
def test_pcre_constructs_match_as_pcre_does(pattern, matches, misses):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = compile_pcre(pattern, icase=False)
    assert all(compiled.search(s) for s in matches), (pattern, to_python(pattern))
    assert not any(compiled.search(s) for s in misses), (pattern, to_python(pattern))


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("[[:foo:]]", "unknown POSIX class name [:foo:]"),
        ("[[:^alpha:]]", "write [^[:alpha:]] instead"),
        ("[[.a.]]", "collating elements"),
        ("[[=a=]]", "collating elements"),
        ("[:alpha:]", "valid only inside a class"),
        ("\\Qa.b\\E", "bad escape"),
        ("[abc", "missing terminating ]"),
    ],
)
def test_what_python_cannot_read_as_pcre_is_refused(pattern, why):
    with pytest.raises(ValueError, match="invalid regular expression") as info:
        compile_pcre(pattern, icase=False)
    assert why in str(info.value)


def test_rule_condition_with_a_posix_class_fires():
    text = BASE + (
        "routes:\n  - location: /\n    upstream: app\n    rules:\n"
        "      - {if: '$request_uri ~ \"^/[[:digit:]]+$\"', return: 403}\n"
    )
    compiled = load_config_text(text, "conf.yaml")
    rule = compiled.routes[0].rules[0]
    assert rule.test(context("GET", "/123"))
    assert not rule.test(context("GET", "/abc"))


def test_location_regex_with_a_posix_class():
    location = parse_location("~ ^/v[[:digit:]]+/")
    assert location.pattern is not None and location.pattern.search("/v2/x")
    assert not location.pattern.search("/v:/x")


def test_gateway_check_names_file_line_for_a_bad_posix_class():
    text = BASE + (
        "maps:\n  bad: {source: $uri, values: {'~[[:nope:]]': '1'}}\n"
        "rules: [{if: '$uri ~ [[:^alpha:]]', return: 403}]\n"
        "routes:\n  - location: '~ ^/[[.a.]]'\n    upstream: app\n"
    )
    with pytest.raises(ConfigErrors) as info:
        load_config_text(text, "conf.yaml")
    shown = str(info.value)
    assert "conf.yaml:5:" in shown and "unknown POSIX class name [:nope:]" in shown, shown
    assert "conf.yaml:6:" in shown and "negated POSIX class" in shown, shown
    assert "conf.yaml:8:" in shown and "collating elements" in shown, shown


def test_perl_classes_and_case_folding_are_ascii_as_in_nginx_pcre() -> None:
    # nginx compiles without PCRE's UTF mode: an Arabic-Indic digit is no \d, an accented letter no \w,
    # and case folding stops at ASCII; Python's str patterns would read all three as Unicode
    assert compile_pcre(r"^/\d+$", icase=False).match("/123")
    assert not compile_pcre(r"^/\d+$", icase=False).match("/\u0661\u0662")
    assert not compile_pcre(r"^/\w+$", icase=False).match("/caf\u00e9")
    assert not compile_pcre("^/\u00e9$", icase=True).match("/\u00c9")
    assert compile_pcre("^/ADMIN$", icase=True).match("/admin")
