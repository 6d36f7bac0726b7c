"""``import-nginx`` writes ``maps:``, ``geo:`` and ``rules:`` (issue 24): each idiom nginx users rate-limit
and guard with, translated, checked by ``gateway check``, and its compiled plan deciding as nginx does."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.http.rules import first_answer
from gateway.plan import load_config_text
from tests.support.importing import APP, Imported, run
from tests.support.importing import request_context as context


def plan(got: Imported):  # type: ignore[no-untyped-def]
    return load_config_text(got.text, "imported.yaml")


def test_the_allowlist_idiom_geo_then_map_then_zone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    got = run(
        tmp_path,
        capsys,
        "http {\n"
        "  geo $limited { default 1; 10.0.0.0/8 0; 192.168.0.0/16 0; delete 192.168.0.0/16; }\n"
        '  map $limited $limit_key { 0 ""; 1 $binary_remote_addr; }\n'
        "  limit_req_zone $limit_key zone=per_ip:10m rate=10r/s;\n"
        f"  server {{ listen 8080; location / {{ limit_req zone=per_ip burst=5; {APP} }} }} }}\n",
    )
    assert got.code == 0, got.stderr
    assert got.doc["geo"] == {"limited": {"default": "1", "values": {"10.0.0.0/8": "0"}}}  # delete: gone
    assert got.doc["maps"] == {"limit_key": {"source": "$limited", "values": {"0": "", "1": "$binary_remote_addr"}}}
    assert got.doc["zones"]["per_ip"]["key"] == "$limit_key"
    assert got.routes()["/"]["limit_req"] == [{"zone": "per_ip", "burst": 5}]
    key = plan(got).routes[0].limit_req[0].key
    assert key(context(client="10.1.2.3")) == b""  # inside: an empty key is not counted
    assert key(context(client="192.168.1.1")) == bytes([192, 168, 1, 1])  # deleted from the allowlist
    assert list(got.doc)[:2] == ["listen", "geo"]  # read first, written first


def test_a_post_only_zone_and_a_per_user_agent_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    got = run(
        tmp_path,
        capsys,
        "http {\n"
        '  map $request_method $post_key { POST $binary_remote_addr; default ""; }\n'
        '  map $http_user_agent $bot_key { default ""; "~*(?<kind>bot|spider)" "$kind:$remote_addr"; }\n'
        "  map $http_user_agent $unused { default 1; }\n"
        "  limit_req_zone $post_key zone=posts:1m rate=1r/s;\n"
        "  limit_req_zone $bot_key zone=bots:1m rate=1r/m;\n"
        f"  server {{ listen 8080; location / {{ limit_req zone=posts; limit_req zone=bots; {APP} }} }} }}\n",
    )
    assert got.code == 0, got.stderr
    assert set(got.doc["maps"]) == {"post_key", "bot_key"}  # $unused: nothing written uses it
    assert "map $http_user_agent $unused" in next(x for x in got.stderr.splitlines() if "same as nginx here" in x)
    posts, bots = plan(got).routes[0].limit_req
    assert posts.key(context("GET")) == b"" and posts.key(context("POST")) == bytes([192, 0, 2, 7])
    assert bots.key(context(headers={"User-Agent": "Mozilla/5.0"})) == b""
    assert bots.key(context(headers={"User-Agent": "x Googlebot/2.1"})) == b"bot:192.0.2.7"


def test_map_forms_hostnames_regexes_multi_variable_sources_and_includes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "agents.map").write_text('"~*curl" tool;\nvolatile;\n')
    got = run(
        tmp_path,
        capsys,
        "http {\n"
        "  map $host $tenant { hostnames; default none; *.a.test a; b.test b; www.c.* c; }\n"
        '  map "$request_method:$uri" $route_key { "GET:/login" login; ~^POST:/api/ api; default ""; }\n'
        "  map $http_user_agent $agent { default human; include agents.map; }\n"
        "  limit_req_zone $route_key zone=routes:1m rate=1r/s;\n"
        "  server { listen 8080; location / {\n"
        "    limit_req zone=routes; add_header X-Tenant $tenant; add_header X-Agent $agent;\n"
        f"    {APP} }} }} }}\n",
    )
    assert got.code == 0, got.stderr
    maps = got.doc["maps"]
    assert maps["tenant"] == {
        "source": "$host",
        "hostnames": True,
        "default": "none",
        "values": {"*.a.test": "a", "b.test": "b", "www.c.*": "c"},
    }
    assert maps["route_key"]["source"] == "$request_method:$uri"
    assert maps["agent"] == {"source": "$http_user_agent", "default": "human", "values": {"~*curl": "tool"}}
    route = plan(got).routes[0]
    key = route.limit_req[0].key
    assert key(context("GET", "/login")) == b"login" and key(context("POST", "/api/x")) == b"api"
    assert key(context("GET", "/other")) == b""


def test_if_return_becomes_rules_server_level_before_location_level(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = run(
        tmp_path,
        capsys,
        "http {\n"
        '  map $http_user_agent $bad_bot { default 0; "~*(sqlmap|nikto)" 1; }\n'
        "  server { listen 8080;\n"
        "    if ($request_method !~ ^(GET|HEAD|POST)$) { return 405; }\n"
        "    if ($bad_bot) { return 444; }\n"
        "    location / {\n"
        '      if ($request_uri ~ "/\\.git") { return 403; }\n'
        "      if ($http_x_token = '') { return 401 \"token please\"; }\n"
        '      if ($http_x_old != "") { return 301 https://new.test$request_uri; }\n'
        "      if ($http_user_agent ~* 'bad bot') { return 403; }\n"
        "      if ($arg_x !~* ^[a-z]+$) { return 400; }\n"
        f"      {APP} }} }} }}\n",
    )
    assert got.code == 0, got.stderr
    assert got.doc["rules"] == [
        {"if": "$request_method !~ ^(GET|HEAD|POST)$", "return": 405},
        {"if": "$bad_bot", "return": 444},
    ]
    route = got.routes()["/"]
    assert route["rules"] == [
        {"if": "$request_uri ~ '/\\.git'", "return": 403},
        {"if": "$http_x_token = ''", "return": {"code": 401, "text": "token please"}},
        {"if": "$http_x_old != ''", "return": {"code": 301, "url": "https://new.test$request_uri"}},
        {"if": "$http_user_agent ~* 'bad bot'", "return": 403},
        {"if": "$arg_x !~* ^[a-z]+$", "return": 400},
    ]
    assert route["upstream"] and "skipped" not in got.stderr
    compiled = plan(got)
    server, routes = compiled.servers[0], compiled.routes
    assert first_answer(server.rules, context("DELETE")).code == 405  # type: ignore[union-attr]
    assert first_answer(server.rules, context(headers={"User-Agent": "sqlmap/1"})).code == 444  # type: ignore[union-attr]
    assert first_answer(server.rules, context()) is None
    ok = {"X-Token": "t"}
    assert first_answer(routes[0].rules, context("GET", "/r/.git/config", ok)).code == 403  # type: ignore[union-attr]
    assert first_answer(routes[0].rules, context("GET", "/?x=1")).code == 401  # type: ignore[union-attr]
    assert first_answer(routes[0].rules, context("GET", "/?x=Abc", ok)) is None
    assert first_answer(routes[0].rules, context("GET", "/?x=1", ok)).code == 400  # type: ignore[union-attr]


def test_untranslatable_ifs_fail_closed_and_say_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = (
        "http { server { listen 8080;\n"
        "  location /f/ { if (-f $request_filename) { return 403; } " + APP + " }\n"
        "  location /s/ { if ($http_x_a) { set $b 1; return 403; } " + APP + " }\n"
        "  location /r/ { if ($http_x_a) { rewrite ^ /x permanent; } " + APP + " }\n"
        "  location /u/ { if ($invalid_referer) { return 403; } " + APP + " }\n"
        "  location /n/ { return 403; if ($http_x_a) { return 200; } }\n"
        "  location /e/ { error_page 418 = @php; if ($http_x_a) { return 418; } " + APP + " }\n"
        "} }\n"
    )
    got = run(tmp_path, capsys, conf)
    routes = got.routes()
    for where in ("/f/", "/s/", "/r/", "/u/", "/e/"):
        assert routes[where] == {"location": where, "return": {"code": 403}}, where
    assert "file tests" in got.skipped("2") and "if (-f $request_filename)" in got.skipped("2")
    assert "its block holds set" in got.skipped("3")
    assert "redirects requests matching ($http_x_a), which would otherwise reach the backend" in got.skipped("4")
    assert '"invalid_referer"' in got.skipped("5")
    assert "never reached" in got.skipped("6")
    assert "takes over its 418 (the gateway follows none)" in got.skipped("7")  # nginx hands it to @php
    opened = run(tmp_path, capsys, conf, "--allow-open")
    assert all("upstream" in opened.routes()[w] for w in ("/f/", "/s/", "/r/", "/u/"))
    assert "requests matching (-f $request_filename) reach the backend" in opened.skipped("2")


def test_maps_the_gateway_cannot_translate_are_skipped_with_what_uses_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = run(
        tmp_path,
        capsys,
        "http {\n"
        "  map $sent_http_content_type $expires { default off; ~image/ 1M; }\n"
        "  map $expires $k { default $binary_remote_addr; }\n"
        "  geo $realip_geo { proxy 10.0.0.0/8; default 1; }\n"
        "  limit_req_zone $k zone=z:1m rate=1r/s;\n"
        f"  server {{ listen 8080; location / {{ limit_req zone=z; {APP} }} }} }}\n",
    )
    assert "maps" not in got.doc and "geo" not in got.doc and "zones" not in got.doc
    assert '"sent_http_content_type"' in got.skipped("2")
    assert "expires" in got.skipped("3")  # it used the skipped map
    assert "proxy (" in got.skipped("4") and "set_real_ip_from" in got.skipped("4")
    assert "zone" in got.skipped("5")
    assert "limit_req" not in got.routes()["/"]


def test_geo_ranges_and_an_explicit_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    got = run(
        tmp_path,
        capsys,
        "http {\n"
        "  geo $http_x_real $zone_of { ranges; default far; 10.0.0.0-10.0.0.255 near; 10.1.0.0/16 mid; }\n"
        "  limit_req_zone $zone_of zone=z:1m rate=1r/s;\n"
        f"  server {{ listen 8080; location / {{ limit_req zone=z; {APP} }} }} }}\n",
    )
    assert got.doc["geo"]["zone_of"] == {
        "source": "$http_x_real",
        "ranges": True,
        "default": "far",
        "values": {"10.0.0.0-10.0.0.255": "near", "10.1.0.0-10.1.255.255": "mid"},
    }
    key = plan(got).routes[0].limit_req[0].key
    assert key(context(headers={"X-Real": "10.0.0.9"})) == b"near"
    assert key(context(headers={"X-Real": "10.1.9.9"})) == b"mid"
    assert key(context(headers={"X-Real": "nonsense"})) == b"far"


def test_each_server_keeps_its_rules_and_an_if_before_a_server_return_is_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = run(
        tmp_path,
        capsys,
        "http {\n"
        "  server { listen 8080; server_name a.test;\n"
        "    if ($http_x_forwarded_proto = 'https') { return 400; }\n"
        "    return 301 https://$host$request_uri;\n"
        "    if ($http_x_never) { return 403; } }\n"
        "  server { listen 8080; server_name b.test; if ($request_method = TRACE) { return 405; }\n"
        f"    location / {{ {APP} }} }} }}\n",
    )
    a, b = got.doc["servers"]
    assert a["rules"] == [{"if": "$http_x_forwarded_proto = 'https'", "return": 400}]
    assert a["routes"] == [{"location": "/", "return": {"code": 301, "url": "https://$host$request_uri"}}]
    assert "never reached" in got.skipped("5")
    assert b["rules"] == [{"if": "$request_method = TRACE", "return": 405}] and b["routes"][0]["upstream"]


def test_a_set_or_rewrite_beside_an_if_fails_closed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """nginx runs a set or rewrite written before an if first; a set in scope may assign what it reads."""
    conf = (
        "http { map $http_user_agent $blocked { default 0; ~bot 1; } map $blocked $via { default 0; 1 1; }\n"
        "  map $via $deep { default 0; 1 1; }\n"
        "  server { listen 8080; set $srv 1; if ($http_x_c) { set $via 1; }\n"
        "  location /admin { set $blocked 1; if ($blocked) { return 403; } " + APP + " }\n"
        "  location / { rewrite ^/old/(.*)$ /secret/$1; if ($uri ~ ^/secret) { return 403; } " + APP + " }\n"
        "  location /late/ { if ($blocked) { return 403; } set $blocked 1; " + APP + " }\n"
        "  location /flag/ { if ($http_x_a) { set $no 1; } if ($http_x_b) { return 403; } " + APP + " }\n"
        "  location /srv/ { if ($srv) { return 403; } " + APP + " }\n"
        "  location /ok/ { if ($blocked) { return 403; } " + APP + " }\n"
        "  location /via/ { if ($via) { return 403; } " + APP + " }\n"
        "  location /deep/ { if ($deep) { return 403; } " + APP + " }\n"
        "} }\n"
    )
    got = run(tmp_path, capsys, conf)
    routes = got.routes()
    for where in ("/admin", "/", "/late/", "/flag/", "/srv/", "/via/", "/deep/"):
        assert routes[where] == {"location": where, "return": {"code": 403}}, where
    assert "the set at " in got.skipped("4") and "runs before it in nginx" in got.skipped("4")
    assert "the rewrite at " in got.skipped("5")
    assert "assigns $blocked, which it reads" in got.skipped("6")
    assert "the if at " in got.skipped("7")  # an if holding a set runs first too
    assert "assigns $srv, which it reads" in got.skipped("8")  # the server's set
    assert "assigns $via, which it reads" in got.skipped("10")  # the server's set, in an if
    assert "assigns $via, which it reads" in got.skipped("11")  # through the map $deep reads
    assert routes["/ok/"]["rules"] == [{"if": "$blocked", "return": 403}]  # no set reaches it
    opened = run(tmp_path, capsys, conf, "--allow-open")
    assert all("upstream" in opened.routes()[w] for w in ("/admin", "/", "/late/", "/flag/", "/srv/"))
    assert "(--allow-open): requests matching ($blocked) reach the backend" in opened.skipped("4")


def test_only_an_error_page_that_hands_the_request_on_refuses_a_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plain local page answers nginx's code with another body: the rule stands, noted. A new
    code, a named location or a redirect changes what the client gets: the route fails closed."""
    conf = (
        "http { map $http_user_agent $bad_bot { default 0; ~bot 1; }\n"
        "  server { listen 8080; error_page 403 /403.html; error_page 404 = @fallback;\n"
        "    error_page 410 =200 /gone.html; error_page 451 https://example.com/legal;\n"
        "  location / { if ($bad_bot) { return 403; } " + APP + " }\n"
        "  location /a/ { if ($bad_bot) { return 404; } " + APP + " }\n"
        "  location /b/ { if ($bad_bot) { return 410; } " + APP + " }\n"
        "  location /c/ { if ($bad_bot) { return 451; } " + APP + " }\n"
        "  location @fallback { " + APP + " }\n"
        "} }\n"
    )
    got = run(tmp_path, capsys, conf)
    routes = got.routes()
    assert routes["/"]["rules"] == [{"if": "$bad_bot", "return": 403}]
    rules = plan(got).routes[0].rules
    assert first_answer(rules, context(headers={"User-Agent": "evilbot"})).code == 403  # type: ignore[union-attr]
    assert first_answer(rules, context(headers={"User-Agent": "Mozilla"})) is None  # not 403 to everyone
    assert "nginx.conf:4: nginx answers its 403 with the page of the error_page at " in got.stderr, got.stderr
    for where, line, page in (("/a/", "5", "2"), ("/b/", "6", "3"), ("/c/", "7", "3")):
        assert routes[where] == {"location": where, "return": {"code": 403}}, where
        assert f"nginx.conf:{page} takes over its" in got.skipped(line), where
