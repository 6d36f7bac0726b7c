"""nginx location matching order and URI normalisation."""

from __future__ import annotations

import pytest

from gateway.routing import BadURI, LocationTable, normalize_uri, parse_location


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
