"""nginx location matching order and URI normalisation."""

from __future__ import annotations

import random
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.http.routing import BadURI, LocationTable, backend_readings, normalize_uri, parse_location
from tests.support.paths import SCRIPTS

sys.path.insert(0, str(SCRIPTS))

from routing_reference import ReferenceTable, large_locations


def table(*locations: str) -> LocationTable[str]:
    return LocationTable([(parse_location(loc), loc) for loc in locations])


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("/", "= /"),
        ("/index.html", "/"),
        ("/documents/document.html", "/documents/"),
        ("/images/1.gif", "^~ /images/"),
        ("/documents/1.jpg", "~* \\.(gif|jpg|jpeg)$"),
        ("/x/1.JPG", "~* \\.(gif|jpg|jpeg)$"),
    ],
)
def test_nginx_documentation_example(uri, expected):
    # The example from nginx's "location" documentation: configurations A to E.
    t = table("= /", "/", "/documents/", "^~ /images/", "~* \\.(gif|jpg|jpeg)$")
    assert t.match(uri).route == expected


def test_regex_order_is_configuration_order_and_beats_a_longer_prefix():
    t = table("/api/v1/users/", "~ ^/api/", "~ users")
    assert t.match("/api/v1/users/7").route == "~ ^/api/"
    assert t.match("/other/users").route == "~ users"


def test_case_sensitive_regex_and_named_groups():
    t = table("/", "~ \\.PHP$", "~ ^/u/(?<id>\\d+)$")
    assert t.match("/a.php").route == "/"
    assert t.match("/a.PHP").route == "~ \\.PHP$"
    assert t.match("/u/42").route == "~ ^/u/(?<id>\\d+)$"


def test_exact_match_wins_over_everything():
    t = table("= /api", "/api/", "~ api")
    assert t.match("/api").route == "= /api"


def test_auto_redirect_for_a_prefix_ending_in_slash():
    t = table("/", "/api/", "~ ^/api$")
    match = t.match("/api")
    assert match.route is None and match.redirect == "/api/"


def test_no_route():
    assert table("/api/", "= /x").match("/y").route is None


@pytest.mark.parametrize(
    ("raw", "uri"),
    [
        ("/a//b///c", "/a/b/c"),
        ("/a/./b/../c", "/a/c"),
        ("/a/%2e%2e/b", "/b"),
        ("/%41%42c", "/ABc"),
        ("/a/b/..", "/a/"),
        ("/a/.", "/a/"),
        ("/caf%C3%A9", "/café"),
        ("/a%2Fb", "/a/b"),
    ],
)
def test_uri_normalisation(raw, uri):
    assert normalize_uri(raw) == uri


@pytest.mark.parametrize("raw", ["/..", "/a/../..", "/%zz", "/%4", "/a%00b", "relative", "*"])
def test_bad_uris(raw):
    with pytest.raises(BadURI):
        normalize_uri(raw)


@pytest.mark.parametrize("bad", ["", "~ ", "= ", "api/", "~ (", "=  x"])
def test_bad_locations(bad):
    with pytest.raises(ValueError):
        parse_location(bad)


# --- the compiled table against the straightforward matcher ------------------------------------


LOCATION_POOL = [
    "/",
    "/a",
    "/a/",
    "/ab",
    "/a/b",
    "/a/b/",
    "/b/",
    "/A/",
    "/a/b/c",
    "/api/",
    "/api",
    "/api/v1/",
    "= /",
    "= /a",
    "= /a/b",
    "= /api",
    "^~ /a/",
    "^~ /b",
    "^~ /api/v1/",
    "^~ /",
    "~ a",
    "~ ^/a",
    "~ b$",
    "~ \\.(gif|jpg)$",
    "~* \\.(GIF|jpg)$",
    "~* ^/A/B",
    "~ ^/a/(b|c)",
    "~ (a)\\1",
    "~ ^/(?<seg>[ab])/",
    "~ (?P<x>b)(?P=x)",
    "~ (?i)^/api",
    "~ c",
    "~ ^/api/v1/.*/x$",
    "~* API",
    "~ ^/a/b$",
    "~ (b)?c",
    "~ ab|ba",
    "~ (?=.*c)b",
    "~ (?<=a)b",
    "~ x*",
    "~ [.]x",
    # anchored on a literal (indexed): start or end, case-sensitive or not, \\Z, a repeat after it
    "~ ^/a/",
    "~* ^/ks",
    "~* ^/A/",
    "~ \\.jpg$",
    "~* \\.GIF$",
    "~ c\\Z",
    "~ ^/ab?",
    "~ ^/",
    "~* s$",
    "~ ^/a\\Z",
    "~ (?m)^b",
    "~ ^/a|c$",
    "~* ^/SS",
]
URI_ALPHABET = "/abcABCxigfjp.1ks\n\u212a\u017f"  # with a newline, the Kelvin sign and the long s


def both(locations):
    entries = [(parse_location(loc), f"{i}:{loc}") for i, loc in enumerate(locations)]
    return LocationTable(entries), ReferenceTable(entries)


def answer(match):
    return (match.route, match.redirect)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    locations=st.lists(st.sampled_from(LOCATION_POOL), min_size=1, max_size=60),
    uris=st.lists(st.text(URI_ALPHABET, max_size=14).map(lambda s: "/" + s), min_size=1, max_size=20),
)
def test_compiled_table_agrees_with_the_reference(locations, uris):
    table_, reference = both(locations)
    for uri in uris + uris:  # twice: the second answer comes from the decision cache
        assert answer(table_.match(uri)) == reference.match(uri), uri


def test_many_regexes_first_in_configuration_order_not_leftmost():
    # 100 regexes (four alternations); later ones match earlier in the URI than earlier ones.
    locations = ["/"] + [f"~ x{i:03d}$" for i in range(100)] + ["~ ^/", "~* ^/Y"]
    table_, reference = both(locations)
    for uri in ["/x050", "/x000", "/x099", "/y", "/Yx031", "/x031x032", "/nothing", "/x12"]:
        assert answer(table_.match(uri)) == reference.match(uri), uri
    # a regex early in the list that matches late in the URI beats a later one that matches first
    t, ref = both(["~ zz$", *[f"~ ^/a{i}" for i in range(40)]])
    assert answer(t.match("/a1zz")) == ref.match("/a1zz") == ("0:~ zz$", None)


def test_generated_large_config_agrees_with_the_reference():
    rng = random.Random(7)
    locations = large_locations(rng, prefixes=1500, regexes=500)
    table_, reference = both(locations)
    uris = [f"/svc{rng.randrange(1600)}/x{rng.randrange(9)}" for _ in range(300)]
    uris += [f"/static/file{rng.randrange(600)}.e{rng.randrange(600)}" for _ in range(300)]
    uris += ["/", "/unknown", "/svc1", "/svc1/", "/svc12/a.e3"]
    for uri in uris:
        assert answer(table_.match(uri)) == reference.match(uri), uri


def test_decision_cache_is_bounded_and_keeps_the_uris_in_use():
    t, _ = both(["/", "~ \\.php$", *[f"/p{i}/" for i in range(20)]])
    cache = t._cache
    assert cache is not None
    for i in range(50_000):  # a flood of distinct URIs
        t.match(f"/flood/{i}")
        t.match("/hot.php")
    assert len(cache) <= 2 * 4096
    assert cache.get("/hot.php") is t.match("/hot.php")  # the URI in steady use stays cached
    long_uri = "/" + "a" * 1000
    assert t.match(long_uri).route == "0:/"
    assert cache.get(long_uri) is None  # very long URIs are decided each time, never kept


def test_a_small_table_has_no_cache():
    t, _ = both(["/", "/api/"])
    assert t._cache is None


@pytest.mark.parametrize(
    "uri",
    ["/a.jpg", "/a.jpg\n", "/a.JPG", "/a.jpgx", "/A/x.Gif", "/\u212a", "/\u212as", "/ks", "/KS", "/s\n", "/x.gif\n"],
)
def test_regexes_anchored_on_a_literal_agree_with_the_reference(uri):
    # indexed by their literal: "$" also matches before a final newline, and a case-insensitive
    # literal also matches the Kelvin sign for k and the long s for s (Python's Unicode folding)
    t, ref = both(["/", "~ \\.jpg$", "~* \\.GIF$", "~* ^/K", "~* s$", "~ ^/ks"])
    assert answer(t.match(uri)) == ref.match(uri)


@pytest.mark.parametrize(
    ("uri", "readings"),
    [
        ("/admin;x=y", ["/admin"]),
        ("/public/..;/admin", ["/admin"]),
        ("/a;b/c;d/", ["/a/c/"]),
        ("/public\\..\\admin", ["/admin"]),
        ("/a\\b;x/..;/c", ["/c", "/a/b;x/..;/c", "/a/c"]),
        ("/plain", []),
    ],
)
def test_backend_readings(uri, readings):
    assert backend_readings(uri) == readings


def test_a_reading_above_the_root_is_a_bad_uri():
    with pytest.raises(BadURI):
        backend_readings("/..;/x")


@pytest.mark.parametrize("raw", ["/%252e", "/%252F", "/a%255c", "/%253b", "/%2500", "/%c0%ae", "/%C1%9C", "/%e0%80%ae"])
def test_double_encoded_and_overlong_escapes_are_bad_uris(raw):
    with pytest.raises(BadURI):
        normalize_uri(raw)


@pytest.mark.parametrize("raw", ["/%25", "/%2541", "/caf%C3%A9", "/%e0%a4%85"])
def test_other_escapes_pass(raw):
    normalize_uri(raw)


def test_a_uri_a_backend_reads_as_routed_elsewhere_is_refused():
    routes = table("= /admin", "/admin/", "/")
    assert routes.match("/admin;x=y").refused
    assert routes.match("/a\\..\\admin/x").refused
    assert routes.match("/..;/admin").refused
    assert routes.match("/public;jsessionid=1") == routes.match("/public")
    assert routes.match("/admin/x;y").route == "/admin/"
