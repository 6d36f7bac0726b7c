"""``gateway import-nginx``: nginx's grammar, the translation, and ``gateway check`` on every corpus config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.nginxconf.parser import ParseError, parse_config, parse_text
from tests.support.paths import ROOT

CORPUS = Path(__file__).parent / "nginx_corpus"
CONFIGS = sorted(CORPUS.glob("*/nginx.conf"))


def _gateway(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args], cwd=str(ROOT), capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize("conf", CONFIGS, ids=[c.parent.name for c in CONFIGS])
def test_every_imported_corpus_config_passes_check(conf: Path, tmp_path: Path) -> None:
    out = tmp_path / "limits.yaml"
    imported = _gateway("import-nginx", str(conf), "-o", str(out))
    assert imported.returncode in (0, 2), imported.stderr
    assert "Traceback" not in imported.stderr
    checked = _gateway("check", "-c", str(out))
    assert checked.returncode == 0 and checked.stdout.strip() == "ok", checked.stderr + out.read_text()
    # every skipped directive is on stderr with file:line and also in the output as a comment
    text = out.read_text()
    for line in imported.stderr.splitlines():
        if line.startswith("gateway: skipped: "):
            assert "# " + " " * 2 + line.removeprefix("gateway: skipped: ") in text


def test_exit_status_zero_when_everything_is_translated(tmp_path: Path) -> None:
    result = _gateway("import-nginx", str(CORPUS / "limits_only" / "nginx.conf"))
    assert result.returncode == 0, result.stderr
    doc = yaml.safe_load(result.stdout)
    assert doc["listen"] == "127.0.0.1:8083"
    assert doc["zones"]["ip"] == {"type": "req", "key": "$binary_remote_addr", "rate": "2r/s", "size": "1m"}
    # the server-level limit_req is inherited by "/" but not by "/c/"? nginx: /c/ has no limit_req of its own,
    # so it inherits the server's too (limit_conn is another array)
    by_location = {r["location"]: r for r in doc["routes"]}
    assert by_location["/"]["limit_req"] == [{"zone": "ip", "burst": 1}]
    assert by_location["/c/"]["limit_req"] == [{"zone": "ip", "burst": 1}]
    assert by_location["/c/"]["limit_conn"] == [{"zone": "c", "max": 1}]
    assert by_location["/c/"]["limit_conn_status"] == 429
    assert "limit_conn" not in by_location["/"]


def test_full_corpus_translation(tmp_path: Path) -> None:
    result = _gateway("import-nginx", str(CORPUS / "full" / "nginx.conf"))
    assert result.returncode == 2
    doc = yaml.safe_load(result.stdout)
    routes = {r["location"]: r for r in doc["routes"]}
    # nginx inheritance: /api/ has its own limit_req list, so the server's is not inherited; its nested
    # locations inherit /api/'s list, limit_conn, dry run and timeouts
    assert routes["/api/"]["limit_req"] == [
        {"zone": "per_ip", "burst": 5, "nodelay": True},
        {"zone": "per_key", "burst": 10},
    ]
    assert routes["~ \\.json$"]["limit_req"] == routes["/api/"]["limit_req"]
    # allow 10.0.0.0/8; deny all; is the route's own first-match list (the server's is not inherited)
    assert routes["/api/admin/"]["access"] == [{"allow": "10.0.0.0/8"}, {"deny": "all"}]
    assert routes["/api/admin/"]["upstream"] == "app" and "access" not in routes["/api/"]
    assert routes["/"]["limit_req"] == [{"zone": "per_ip", "burst": 20, "delay": 8}]
    assert routes["/upload/"]["client_max_body_size"] == "0"
    assert routes["/"]["limit_req_status"] == 429  # from the http level
    assert doc["upstreams"]["app"]["servers"][0] == {
        "address": "127.0.0.1:9000",
        "weight": 3,
        "max_fails": 2,
        "fail_timeout": "5s",
    }
    assert doc["upstreams"]["app"]["keepalive"] == 16
    assert doc["upstreams"]["app"]["balance"] == "least_conn"  # with its backup server, as nginx allows
    assert doc["upstreams"]["127.0.0.1_9100"] == {
        "servers": ["127.0.0.1:9100"],
        "connect_timeout": "2s",
        "read_timeout": "30s",
        "next_upstream_tries": 3,
    }
    assert doc["access"] == [{"deny": "192.0.2.0/24"}, {"deny": "2001:db8::/32"}, {"allow": "all"}]
    assert doc["real_ip"] == {"from": ["10.0.0.0/8", "192.168.0.0/16"], "header": "X-Forwarded-For", "recursive": True}
    assert "$limit_req_status" in doc["log"]["format"] and doc["log"]["access"] == "stdout"
    assert doc["workers"] == "auto" and doc["worker_connections"] == 2048
    assert doc["zones"]["per_server"]["key"] == "$server_name"  # a gateway key variable too
    # if ($http_user_agent ~ bot) { return 403; } is a rule of its route, which proxies
    gifs = routes["~* \\.(gif|jpe?g)$"]
    assert gifs["rules"] == [{"if": "$http_user_agent ~ bot", "return": 403}] and "upstream" in gifs
    assert "maps" not in doc
    assert routes["/api/admin/"]["access"] == [{"allow": "10.0.0.0/8"}, {"deny": "all"}]  # a location's own list
    skipped = result.stderr
    for where, what in [
        ("nginx.conf:38)", "same as nginx here"),  # a map nothing written uses: no key
        ("conf.d/site.conf:46:", "a named location no try_files here reaches"),
        ("conf.d/site.conf:36:", "no proxy_pass"),
    ]:
        assert any(where in line and what in line for line in skipped.splitlines()), (where, what, skipped)
    # the features the gateway has now are keys, no longer comments
    assert "# needs:" not in result.stdout
    assert routes["/api/"]["uri"] == "/v1/"


def test_the_agreed_keys_are_written() -> None:
    result = _gateway("import-nginx", str(CORPUS / "full" / "nginx.conf"))
    doc = yaml.safe_load(result.stdout)
    routes = {r["location"]: r for r in doc["routes"]}
    assert routes["/api/"]["uri"] == "/v1/"
    assert routes["/"]["proxy_set_header"] == {"Host": "$host", "X-Real-IP": "$remote_addr"}
    assert routes["/"]["add_header"] == [{"name": "X-Frame-Options", "value": "DENY", "always": True}]
    assert routes["= /health"]["return"] == {"code": 200, "text": "ok\n"}
    assert routes["/old"]["return"] == {"code": 301, "url": "https://example.com/new"}
    vhosts = yaml.safe_load(_gateway("import-nginx", str(CORPUS / "vhosts" / "nginx.conf")).stdout)
    first, second = vhosts["servers"]
    assert first["server_name"] == ["a.example.com", "*.example.org", "~^(?<sub>.+)\\.example\\.net$"]
    assert second["default_server"] is True and second["routes"][0]["return"] == {"code": 404}


def test_vhosts_are_written_as_servers_and_exit_0() -> None:
    result = _gateway("import-nginx", str(CORPUS / "vhosts" / "nginx.conf"))
    assert result.returncode == 0, result.stderr
    doc = yaml.safe_load(result.stdout)
    assert "routes" not in doc and len(doc["servers"]) == 2
    assert [r["location"] for r in doc["servers"][1]["routes"]] == ["/", "/x/"]


@pytest.mark.parametrize("corpus", ["full", "vhosts", "tricky", "limits_only"])
def test_every_imported_corpus_passes_gateway_check(corpus: str, tmp_path: Path) -> None:
    out = tmp_path / "limits.yaml"
    _gateway("import-nginx", str(CORPUS / corpus / "nginx.conf"), "-o", str(out))
    check = _gateway("check", "-c", str(out))
    assert check.returncode == 0 and check.stdout.strip() == "ok", check.stderr


def test_values_with_variables_the_gateway_lacks_are_skipped_not_written(tmp_path: Path) -> None:
    conf = tmp_path / "nginx.conf"
    conf.write_text(
        "events {}\nhttp { server { listen 127.0.0.1:8080; server_name _ a*b.test ok.test;\n"
        "  location / { proxy_pass http://127.0.0.1:9000;\n"
        "    proxy_set_header X-Conn $connection_upgrade; proxy_set_header X-Id $remote_addr;\n"
        "    add_header X-Req $request_id; }\n"
        "  location = /r { return 302 https://x.test$request_uri; } } }\n"
    )
    result = _gateway("import-nginx", str(conf))
    assert result.returncode == 2
    for where, what in [
        ("nginx.conf:4:", 'proxy_set_header: unknown "connection_upgrade" variable'),
        ("nginx.conf:2:", 'server_name: invalid server name "a*b.test"'),
    ]:
        assert any(where in line and what in line for line in result.stderr.splitlines()), (what, result.stderr)
    doc = yaml.safe_load(result.stdout)
    routes = {r["location"]: r for r in doc["routes"]}
    assert routes["/"]["proxy_set_header"] == {"X-Id": "$remote_addr"}
    assert routes["/"]["add_header"] == [{"name": "X-Req", "value": "$request_id"}]  # nginx's variable here too
    assert routes["= /r"]["return"] == {"code": 302, "url": "https://x.test$request_uri"}
    out = tmp_path / "limits.yaml"
    out.write_text(result.stdout)
    assert _gateway("check", "-c", str(out)).returncode == 0


def test_tricky_forms() -> None:
    doc = yaml.safe_load(_gateway("import-nginx", str(CORPUS / "tricky" / "nginx.conf")).stdout)
    assert doc["zones"]["q"]["key"] == "${binary_remote_addr}x"
    assert doc["zones"]["quoted"]["rate"] == "2r/m"
    assert doc["log"]["format"] == 'a\'b "$request" $status "$http_user_agent"'
    locations = [r["location"] for r in doc["routes"]]
    assert locations == ["~ ^/a{2}/(?<id>[0-9]+)$", "/with space/", "/semi\\;colon/", "/hash#not-a-comment/"]
    assert doc["routes"][1]["limit_req"] == [{"zone": "quoted", "burst": 3, "delay": 1}]
    assert doc["listen"] == "[::1]:8082"


def test_tokenizer_follows_nginx_grammar() -> None:
    tree = parse_text('a "x\\"y" \'q\\\'r\' w\\ v "t\\tn\\z"; # c\nb { c 1; } # end\n')
    assert tree[0].args == ['x"y', "q'r", "w\\ v", "t\tn\\z"]  # nginx keeps \ before a space
    assert tree[1].name == "b" and tree[1].block is not None and tree[1].block[0].args == ["1"]
    assert tree[1].line == 2


@pytest.mark.parametrize(
    "text, line, message",
    [
        ("a 1;\nb {\n c 2;\n", 3, 'expecting "}"'),
        ("a 1;\n}\n", 2, 'unexpected "}"'),
        ('a "open;\n\n', 1, "closing quote"),
        ("a 1\n", 1, 'expecting ";"'),
        ('a "x"y;', 1, "after a quoted string"),
        (";", 1, 'unexpected ";"'),
    ],
)
def test_parse_errors_name_the_line(text: str, line: int, message: str) -> None:
    with pytest.raises(ParseError) as err:
        parse_text(text, "t.conf")
    assert err.value.line == line and message in str(err.value) and str(err.value).startswith(f"t.conf:{line}:")


def test_parse_error_exit_status_1_with_file_and_line(tmp_path: Path) -> None:
    conf = tmp_path / "nginx.conf"
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "bad.conf").write_text("server {\n listen 80;\n")
    conf.write_text("http {\n include inc/*.conf;\n}\n")
    result = _gateway("import-nginx", str(conf))
    assert result.returncode == 1
    assert "inc/bad.conf:2:" in result.stderr and "Traceback" not in result.stderr


def test_includes_follow_globs_in_order_and_refuse_a_loop(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b.conf").write_text("two 2;\n")
    (tmp_path / "d" / "a.conf").write_text("one 1;\n")
    (tmp_path / "main.conf").write_text("include d/*.conf;\ninclude none/*.conf;\nthree 3;\n")
    assert [d.name for d in parse_config(str(tmp_path / "main.conf"))] == ["one", "two", "three"]
    (tmp_path / "loop.conf").write_text("include loop.conf;\n")
    with pytest.raises(ParseError, match="deeper than"):
        parse_config(str(tmp_path / "loop.conf"))
    (tmp_path / "missing.conf").write_text("include nothere.conf;\n")
    with pytest.raises(ParseError, match="No such file"):
        parse_config(str(tmp_path / "missing.conf"))


def test_hostile_configs_are_refused_with_a_line_not_a_crash(tmp_path: Path) -> None:
    deep = tmp_path / "deep.conf"
    deep.write_text("a {" * 5000 + "}" * 5000)
    loop = tmp_path / "loop.conf"
    loop.write_text("include loop.conf;\n")
    for level in range(12):  # no loop, but each file includes the 4 files of the next level: 4^12 files
        (tmp_path / f"L{level}").mkdir()
        for i in range(4):
            (tmp_path / f"L{level}" / f"{i}.conf").write_text(f"include L{level + 1}/*.conf;\n")
    (tmp_path / "L12").mkdir()
    fan = tmp_path / "fan.conf"
    fan.write_text("include L0/*.conf;\n")
    for conf, message in [(deep, "nested deeper than 64"), (loop, "deeper than 32"), (fan, "included files")]:
        result = _gateway("import-nginx", str(conf))
        assert result.returncode == 1 and message in result.stderr and "Traceback" not in result.stderr


def test_tls_listen_and_certificates_translate_and_http2_is_served_as_http1(tmp_path: Path) -> None:
    from tests.support.certs import TestCA

    issued = TestCA(tmp_path / "ca").issue("a", "a.test")
    conf = tmp_path / "nginx.conf"
    conf.write_text(
        "http { ssl_protocols TLSv1.2 TLSv1.3; ssl_session_cache shared:SSL:10m;\n"
        f"  server {{ listen 443 ssl; server_name a.test; ssl_certificate {issued.cert}; "
        f"ssl_certificate_key {issued.key};\n"
        "           location / { proxy_pass http://127.0.0.1:9000; } }\n"
        "  server { listen 8443 http2; location / { proxy_pass http://127.0.0.1:9000; } }\n"
        "  server { listen 8080; location / { proxy_pass http://127.0.0.1:9000; } } }\n"
    )
    result = _gateway("import-nginx", str(conf))
    assert result.returncode == 2
    doc = yaml.safe_load(result.stdout)
    assert doc["ssl_protocols"] == "TLSv1.2 TLSv1.3"
    tls = next(s for s in doc["servers"] if s.get("server_name") == ["a.test"])
    assert tls["listen"] == ["0.0.0.0:443 ssl"]
    assert (tls["ssl_certificate"], tls["ssl_certificate_key"]) == (str(issued.cert), str(issued.key))
    assert "note: http2: served as HTTP/1.1" in result.stderr  # the server is kept (issue 24)
    assert "nginx.conf:1: ssl_session_cache shared:SSL:10m; -- no gateway equivalent" in result.stderr
    assert [s["listen"] for s in doc["servers"]] == [["0.0.0.0:443 ssl"], ["0.0.0.0:8443"], ["0.0.0.0:8080"]]


def test_global_settings_below_their_level_are_skipped_or_override_like_nginx(tmp_path: Path) -> None:
    conf = tmp_path / "nginx.conf"
    conf.write_text(
        "http {\n access_log /var/log/http.log;\n server {\n  listen 8080;\n  access_log /var/log/server.log;\n"
        "  location / {\n   proxy_pass http://127.0.0.1:9000;\n   access_log off;\n   set_real_ip_from 10.0.0.0/8;\n"
        "   keepalive_timeout 5s;\n  }\n }\n}\n"
    )
    result = _gateway("import-nginx", str(conf))
    doc = yaml.safe_load(result.stdout)
    assert doc["log"] == {"access": "/var/log/server.log", "format": "combined"}
    assert "real_ip" not in doc and "keepalive_timeout" not in doc
    for line in ("nginx.conf:2: access_log /var/log/http.log; -- overridden", "nginx.conf:8: access_log off; -- a per-route",
                 "nginx.conf:9: set_real_ip_from", "nginx.conf:10: keepalive_timeout"):  # fmt: skip
        assert line in result.stderr, (line, result.stderr)
