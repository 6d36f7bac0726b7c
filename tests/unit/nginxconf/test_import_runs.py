"""``gateway import-nginx`` (issue 24): an import is a configuration that runs, and fails closed.

Each case writes an nginx.conf, imports it through the CLI's entry and, when the import
writes a configuration, runs ``gateway check`` on it: it must pass. Exit 1 says why in
one line, the last of stderr.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.certs import TestCA
from tests.support.importing import APP, Imported, run


def reason(imported: Imported) -> str:
    """The one line that says why the import exited 1."""
    assert imported.code == 1
    last = imported.stderr.strip().splitlines()[-1]
    assert last.startswith("gateway: ") and ": skipped: " not in last
    return last


def test_nothing_proxied_exits_1_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    php = (
        "http { server { listen 8080; root /srv; location ~ \\.php$ { fastcgi_pass 127.0.0.1:9000; }\n"
        "  location ~ /\\.ht { deny all; } } }\n"
    )
    assert "serves files or FastCGI/uwsgi only" in reason(run(tmp_path, capsys, php))
    static = "http { server { listen 8080; location / { root /srv; } } }\n"
    assert "nothing is proxied: this configuration serves files only" in reason(run(tmp_path, capsys, static))
    fragment = "add_header X-Frame-Options DENY;\n"
    assert "no server block here" in reason(run(tmp_path, capsys, fragment))


def test_a_server_with_no_route_is_left_out_never_routes_null(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = run(
        tmp_path,
        capsys,
        "http { server { listen 8080; location / { root /srv; } }\n"
        f"  server {{ listen 8081; location / {{ {APP} }} }} }}\n",
    )
    assert got.code == 2 and "routes: null" not in got.text and "routes: []" not in got.text
    assert got.doc["listen"] == "0.0.0.0:8081" and got.routes()["/"]["upstream"] == "127.0.0.1_9000"
    assert "nothing is proxied in this server" in got.skipped("1")


def test_no_upstream_is_invented(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    got = run(
        tmp_path,
        capsys,
        "http {\n upstream app { server 127.0.0.1:9002 max_conns=5; }\n"
        " upstream spare { server 127.0.0.1:9001 backup; }\n"
        " server { listen 8080;\n"
        "  location / { proxy_pass http://app; }\n"
        "  location /sock/ { proxy_pass http://unix::/; }\n"
        "  location /spare/ { proxy_pass http://spare; }\n"
        f"  location /ok/ {{ {APP} }}\n }}\n}}\n",
    )
    assert set(got.doc["upstreams"]) == {"127.0.0.1_9000"}  # no app:80, no unix::80, no all-backup spare
    for where in ("/", "/sock/", "/spare/"):
        assert got.routes()[where] == {"location": where, "return": {"code": 503}}
    assert "server parameter max_conns=5 is not supported" in got.skipped("2")
    assert "every server is marked backup or down" in got.skipped("3")
    assert 'upstream "app" was not translated' in got.skipped("5")
    assert "no path in the unix domain socket" in got.skipped("6")
    assert "# refuses every request (503)" in got.text


def test_least_conn_and_unix_socket_servers_are_translated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    got = run(
        tmp_path,
        capsys,
        "http {\n upstream app {\n  least_conn;\n"
        "  server unix:/run/app.sock weight=3 max_fails=2 fail_timeout=5s;\n"
        "  server 127.0.0.1:9001;\n  server unix:/run/spare.sock backup;\n }\n"
        " server { listen 8080;\n"
        "  location / { proxy_pass http://app; }\n"
        "  location /sock/ { proxy_pass http://unix:/run/api.sock:/v1/; }\n"
        "  location /bare/ { proxy_pass http://unix:/run/api.sock; }\n"
        "  location ~ ^/re { proxy_pass http://unix:/run/api.sock; }\n"
        " }\n}\n",
    )
    assert got.code == 0, got.stderr
    assert got.doc["upstreams"] == {
        "app": {
            "servers": [
                {"address": "unix:/run/app.sock", "weight": 3, "max_fails": 2, "fail_timeout": "5s"},
                "127.0.0.1:9001",
                {"address": "unix:/run/spare.sock", "backup": True},
            ],
            "balance": "least_conn",
        },
        # proxy_pass http://unix:/path:/uri is nginx's implicit upstream of that one socket
        "unix__run_api.sock": {"servers": ["unix:/run/api.sock"]},
    }
    routes = got.routes()
    assert routes["/"]["upstream"] == "app"
    assert routes["/sock/"] == {"location": "/sock/", "upstream": "unix__run_api.sock", "uri": "/v1/"}
    assert routes["/bare/"] == {"location": "/bare/", "upstream": "unix__run_api.sock"}
    assert routes["~ ^/re"]["upstream"] == "unix__run_api.sock"
    assert "skipped" not in got.stderr


def test_ssl_listens_need_a_certificate_and_key_that_can_be_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    issued = TestCA(tmp_path / "ca").issue("a", "a.test")
    got = run(
        tmp_path,
        capsys,
        "http {\n"
        f" server {{ listen 8443 ssl; server_name a.test; ssl_certificate {issued.cert}; "
        f"ssl_certificate_key {issued.key}; location / {{ {APP} }} }}\n"
        f" server {{ listen 8444 ssl; server_name b.test; ssl_certificate {issued.cert}; location / {{ {APP} }} }}\n"
        f" server {{ listen 8445 ssl; listen 8081; server_name c.test; location / {{ {APP} }} }}\n"
        f" server {{ listen 8446 ssl; server_name d.test; ssl_certificate /nonexistent/d.pem; "
        f"ssl_certificate_key /nonexistent/d.key; location / {{ {APP} }} }}\n"
        "}\n",
    )
    assert [s["listen"] for s in got.doc["servers"]] == [["0.0.0.0:8443 ssl"], ["0.0.0.0:8081"]]
    assert "listen ssl without ssl_certificate_key: server left out" in got.skipped("3")
    assert "listen ssl without ssl_certificate and ssl_certificate_key: its ssl listens left out" in got.skipped("4")
    assert "cannot read /nonexistent/d.pem here" in got.skipped("5")


def test_listen_parameters_keep_the_server_and_http2_is_said_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    issued = TestCA(tmp_path / "ca").issue("a", "a.test")
    got = run(
        tmp_path,
        capsys,
        "http { server {\n"
        "  listen 127.0.0.1:8443 ssl http2 default_server deferred backlog=511 reuseport so_keepalive=on fastopen=3;\n"
        "  listen [::1]:8443 ssl http2 ipv6only=on;\n  http2 on;\n"
        f"  ssl_certificate {issued.cert}; ssl_certificate_key {issued.key};\n  location / {{ {APP} }} }} }}\n",
    )
    assert got.code == 0, got.stderr
    assert got.doc["listen"] == ["127.0.0.1:8443 ssl", "[::1]:8443 ssl"]
    assert got.stderr.count("http2: served as HTTP/1.1") == 1 and got.text.count("http2: served as HTTP/1.1") == 1
    assert "listen backlog deferred fastopen ipv6only reuseport so_keepalive: socket tuning accepted" in got.stderr


def test_a_proxy_protocol_listen_keeps_its_parameter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    got = run(
        tmp_path, capsys, f"http {{ server {{ listen 8080 proxy_protocol; listen 8081; location / {{ {APP} }} }} }}"
    )
    assert got.doc["listen"] == ["0.0.0.0:8080 proxy_protocol", "0.0.0.0:8081"]


def test_a_server_level_return_is_the_servers_one_route(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    got = run(
        tmp_path,
        capsys,
        "http {\n server { listen 8080; server_name example.com www.example.com;\n"
        "  location /.well-known/acme-challenge/ { root /var/www; }\n"
        "  return 301 https://$server_name$request_uri;\n }\n"
        f" server {{ listen 8081; location / {{ {APP} }} }}\n}}\n",
    )
    first = got.doc["servers"][0]
    assert first["routes"] == [{"location": "/", "return": {"code": 301, "url": "https://example.com$request_uri"}}]
    assert "never reached: the server-level return (" in got.skipped("3")


def test_try_files_to_a_named_location_routes_to_its_upstream_with_its_limits_and_headers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = run(
        tmp_path,
        capsys,
        "http { limit_req_zone $binary_remote_addr zone=app:1m rate=5r/s;\n"
        " limit_req_zone $binary_remote_addr zone=first:1m rate=1r/s;\n"
        " server { listen 8080; root /srv;\n"
        "  location / { try_files $uri $uri/ @app; }\n"
        "  location /api/ { limit_req zone=first; try_files $uri @app; }\n"
        "  location @app { proxy_pass http://127.0.0.1:9000; limit_req zone=app burst=10 nodelay;\n"
        "    proxy_set_header X-Real-IP $remote_addr; proxy_read_timeout 30s; }\n"
        "  location @unused { proxy_pass http://127.0.0.1:9001; } } }\n",
    )
    routes = got.routes()
    assert routes["/"]["upstream"] == "127.0.0.1_9000"
    assert routes["/"]["limit_req"] == [{"zone": "app", "burst": 10, "nodelay": True}]
    assert routes["/"]["proxy_set_header"] == {"X-Real-IP": "$remote_addr"}
    assert got.doc["upstreams"]["127.0.0.1_9000"]["read_timeout"] == "30s"
    # nginx applies limit_req once per request: /api/'s own, not @app's again
    assert routes["/api/"]["limit_req"] == [{"zone": "first"}]
    assert "every request goes to the named location's upstream" in got.stderr
    assert "a named location no try_files here reaches" in got.skipped("8")
    assert "127.0.0.1_9001" not in got.doc["upstreams"]


GUARDED = (
    "http { server { listen 8080;\n"
    "  location / {\n"
    "    if ($request_method !~ ^(GET|HEAD|POST)$) { set $bad 1; return 405; }\n"
    f"    {APP} }}\n"
    "  location /api/ {\n"
    "    if ($request_method = 'OPTIONS') { add_header Access-Control-Allow-Origin *; return 204; }\n"
    f"    {APP} }}\n"
    f"  location /admin/ {{ allow 10.0.0.0/8; deny all; {APP} }}\n"
    f"  location /private/ {{ deny all; {APP} }} }} }}\n"
)


def test_untranslated_guards_fail_closed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    got = run(tmp_path, capsys, GUARDED)
    routes = got.routes()
    assert routes["/"] == {"location": "/", "return": {"code": 403}}
    # allow/deny: the route's own first-match list, checked after the limits as nginx's access phase
    assert routes["/admin/"]["access"] == [{"allow": "10.0.0.0/8"}, {"deny": "all"}]
    assert routes["/private/"]["access"] == [{"deny": "all"}] and routes["/private/"]["upstream"]
    assert routes["/api/"]["upstream"] == "127.0.0.1_9000"  # answering 204 itself is no guard
    guard = got.skipped("3")
    assert "if ($request_method !~ ^(GET|HEAD|POST)$)" in guard and "refuses every request (403)" in guard
    assert "answers 405 to requests matching ($request_method !~ ^(GET|HEAD|POST)$)" in guard
    assert "its block holds set, not a return alone" in guard and "would otherwise reach the backend" in guard
    assert 'if ($request_method = "OPTIONS")' in got.skipped("6")  # the condition keeps its quotes
    assert "# refuses every request (403): if ($request_method" in got.text
    assert (
        "# Fail closed: routes that refuse every request" in got.text
        and "gateway: fail closed: location /:" in got.stderr
    )


def test_allow_open_proxies_and_says_what_reaches_the_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = run(tmp_path, capsys, GUARDED, "--allow-open")
    routes = got.routes()
    assert routes["/"]["upstream"] == routes["/admin/"]["upstream"] == "127.0.0.1_9000"
    assert routes["/private/"]["access"] == [{"deny": "all"}]  # translated: --allow-open opens nothing here
    assert routes["/admin/"]["access"] == [{"allow": "10.0.0.0/8"}, {"deny": "all"}]
    assert "requests matching ($request_method !~ ^(GET|HEAD|POST)$) reach the backend" in got.skipped("3")


def test_a_server_level_guard_refuses_every_route_of_its_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = run(
        tmp_path,
        capsys,
        'http { server { listen 8080; if ($invalid_referer ~ "/\\.git") { return 403; }\n'
        f"  location / {{ {APP} }} location /b/ {{ {APP} }} }} }}\n",
    )
    assert all(r["return"] == {"code": 403} for r in got.doc["routes"])
    guard = got.skipped("1")
    assert 'if ($invalid_referer ~ "/\\\\.git")' in guard and '"invalid_referer"' in guard


def test_each_directive_is_listed_once_and_no_ops_go_to_one_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = run(
        tmp_path,
        capsys,
        "http { sendfile on; tcp_nodelay on; tcp_nopush on;\n"
        " server { listen 8080; proxy_set_header X-Id $request_id_unknown;\n"
        "  proxy_http_version 1.1; proxy_redirect off;\n"
        "  proxy_set_header Upgrade $http_upgrade;\n"
        f"  location /a/ {{ {APP} }} location /b/ {{ {APP} }} location /c/ {{ {APP} break; }} }} }}\n",
    )
    assert got.stderr.count("$request_id_unknown") == 1  # inherited by three routes, listed once
    same = next(line for line in got.stderr.splitlines() if line.startswith("gateway: same as nginx here: "))
    for text in ("sendfile on;", "tcp_nodelay on;", "proxy_http_version 1.1;", "proxy_redirect off;", "break;"):
        assert text in same
    assert "# Same as nginx here" in got.text and "proxy_http_version" not in got.doc["routes"][0]
    assert "Upgrade" not in got.routes()["/a/"].get("proxy_set_header", {})  # the gateway tunnels WebSockets itself
    assert [line for line in got.stderr.splitlines() if "skipped:" in line] == [got.skipped("2")]


def test_only_no_ops_left_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    got = run(tmp_path, capsys, f"http {{ sendfile on; server {{ listen 8080; location / {{ {APP} }} }} }}")
    assert got.code == 0, got.stderr


def test_http_level_allow_deny_becomes_the_top_level_access_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = run(
        tmp_path, capsys, f"http {{ deny 192.0.2.0/24; allow all; server {{ listen 8080; location / {{ {APP} }} }} }}"
    )
    assert got.doc["access"] == [{"deny": "192.0.2.0/24"}, {"allow": "all"}] and got.code == 0, got.stderr
    got = run(
        tmp_path, capsys, f"http {{ allow 10.0.0.0/8; deny all; server {{ listen 8080; location / {{ {APP} }} }} }}"
    )
    assert got.doc["access"] == [{"allow": "10.0.0.0/8"}, {"deny": "all"}] and got.code == 0, got.stderr
    assert "access" not in got.doc["routes"][0]  # inherited, as in nginx


def test_real_ip_said_alike_by_every_server_becomes_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shared = "set_real_ip_from 10.0.0.0/8; real_ip_header X-Forwarded-For;"
    got = run(
        tmp_path,
        capsys,
        f"http {{ server {{ listen 8080; server_name a.test; {shared} location / {{ {APP} }} }}\n"
        f"  server {{ listen 8080; server_name b.test; {shared} location / {{ {APP} }} }} }}\n",
    )
    assert got.doc["real_ip"] == {"from": ["10.0.0.0/8"], "header": "X-Forwarded-For"}
    assert got.code == 0, got.stderr
    got = run(
        tmp_path,
        capsys,
        f"http {{ server {{ listen 8080; server_name a.test; {shared} location / {{ {APP} }} }}\n"
        f"  server {{ listen 8080; server_name b.test; location / {{ {APP} }} }} }}\n",
    )
    assert "real_ip" not in got.doc and "that not every server shares" in got.skipped("1")


def test_authentication_fails_closed_and_internal_locations_answer_404(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = (
        'http { server { listen 8080; auth_basic "Restricted"; auth_basic_user_file /etc/htpasswd;\n'
        f"  location / {{ {APP} }}\n"
        f"  location /public/ {{ auth_basic off; {APP} }}\n"
        f"  location /sso/ {{ auth_basic off; auth_request /auth; {APP} }}\n"
        f"  location /x/ {{ internal; {APP} }} }} }}\n"
    )
    got = run(tmp_path, capsys, conf)
    routes = got.routes()
    assert routes["/"]["return"] == routes["/sso/"]["return"] == {"code": 403}
    assert routes["/public/"]["upstream"] == "127.0.0.1_9000"
    assert routes["/x/"]["return"] == {"code": 404}
    assert "nginx asks for credentials from clients without credentials" in got.skipped("1")
    opened = run(tmp_path, capsys, conf, "--allow-open")
    assert opened.routes()["/"]["upstream"] == "127.0.0.1_9000"
    assert "clients without credentials reach the backend" in opened.skipped("1")


def test_a_server_level_list_stays_in_its_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rules = "deny 192.0.2.0/24; deny 198.51.100.7;"
    got = run(
        tmp_path,
        capsys,
        f"http {{ server {{ listen 8080; server_name a.test; {rules} location / {{ {APP} }} }}\n"
        f"  server {{ listen 8080; server_name b.test; {rules} location / {{ {APP} }} }} }}\n",
    )
    listed = [{"deny": "192.0.2.0/24"}, {"deny": "198.51.100.7"}]
    assert [server["access"] for server in got.doc["servers"]] == [listed, listed] and got.code == 0, got.stderr
    got = run(
        tmp_path,
        capsys,
        f"http {{ server {{ listen 8080; server_name a.test; {rules} location / {{ {APP} }} }}\n"
        f"  server {{ listen 8080; server_name b.test; location / {{ {APP} }} }} }}\n",
    )
    assert "access" not in got.doc
    first, second = got.doc["servers"]
    assert first["access"] == listed and "access" not in second and got.code == 0, got.stderr


def test_server_level_try_files_and_includes_copied_from_their_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "snippets").mkdir()
    (tmp_path / "snippets" / "app.conf").write_text("location @app { proxy_pass http://127.0.0.1:9000; }\n")
    got = run(
        tmp_path,
        capsys,
        "http { include /etc/nginx/mime.types;\n"  # nginx's own file, absent here: nothing to translate in it
        " server { listen 8080; root /srv; try_files $uri @app;\n"
        "  include /nonexistent-host-dir/snippets/app.conf; } }\n",
    )
    assert got.routes()["/"]["upstream"] == "127.0.0.1_9000"
    assert "include /nonexistent-host-dir/snippets/app.conf: read snippets/app.conf" in got.stderr


def test_upstream_addresses_the_gateway_would_refuse_are_not_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = run(
        tmp_path,
        capsys,
        "http { upstream app { server app.local:%%PORT%%; server 127.0.0.1:9001; }\n"
        " server { listen 8080; location / { proxy_pass http://app; } location /t/ { proxy_pass http://x:%%P%%; } } }\n",
    )
    assert got.doc["upstreams"]["app"]["servers"] == ["127.0.0.1:9001"]
    assert got.routes()["/t/"]["return"] == {"code": 503}
    assert "server app.local:%%PORT%%" in got.skipped("1")


def test_nested_locations_inherit_allow_deny_as_nginx(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    got = run(
        tmp_path,
        capsys,
        "http { server { listen 8080;\n"
        f"  location /admin/ {{ allow 10.0.0.0/8; deny all; {APP}\n"
        f"    location /admin/inner/ {{ {APP} }}\n"
        f"    location /admin/open/ {{ allow all; {APP} }} }}\n"
        f"  location /closed/ {{ deny all; location /closed/x/ {{ {APP} }} }} }} }}\n",
    )
    routes = got.routes()
    allowlist = [{"allow": "10.0.0.0/8"}, {"deny": "all"}]
    assert routes["/admin/"]["access"] == routes["/admin/inner/"]["access"] == allowlist  # inherits the parent's
    assert routes["/admin/open/"]["access"] == [{"allow": "all"}]  # its own list replaces the parent's
    assert routes["/closed/x/"]["access"] == [{"deny": "all"}]  # inherits deny all
    assert got.code == 0, got.stderr


def test_allow_deny_at_every_level_with_nginx_inheritance(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    got = run(
        tmp_path,
        capsys,
        "http { deny 192.0.2.1; allow all;\n"
        f" server {{ listen 8080; server_name a.test; allow 10.0.0.0/8; allow unix:; deny all; location / {{ {APP} }}\n"
        f"  location /open/ {{ allow all; {APP} }} location /static/ {{ root /srv; }} }}\n"
        f" server {{ listen 8080; server_name b.test; location / {{ {APP} }}\n"
        f"  location /files/ {{ deny all; root /srv; }}\n"
        f"  location /app/ {{ deny 198.51.100.0/24; try_files $uri @app; }}\n"
        f"  location @app {{ allow 198.51.100.9; deny all; {APP} }} }} }}\n",
    )
    assert got.doc["access"] == [{"deny": "192.0.2.1"}, {"allow": "all"}]  # http level: b.test inherits it
    a, b = got.doc["servers"]
    assert a["access"] == [{"allow": "10.0.0.0/8"}, {"deny": "all"}]  # unix: never matches a TCP client
    assert "unix: peers never reach the gateway" in got.skipped("2")
    routes_a = {r["location"]: r for r in a["routes"]}
    routes_b = {r["location"]: r for r in b["routes"]}
    assert "access" not in routes_a["/"] and routes_a["/open/"]["access"] == [{"allow": "all"}]
    assert "/static/" not in routes_a  # files only: the server's list is not deny-all, nothing to route
    assert routes_b["/files/"] == {"location": "/files/", "return": {"code": 403}}  # files, but 403 to every client
    # try_files -> @app: nginx checks both lists, which no one first-match list says: fails closed
    assert routes_b["/app/"]["return"] == {"code": 403}
    assert "fail closed: location /app/" in got.stderr


def test_a_return_that_cannot_be_translated_refuses_unless_allow_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = (
        f"http {{ server {{ listen 8080; location / {{ {APP} }}\n"
        "  location ~ ^/old/(.*)$ { return 301 /new/$1; } } }\n"
    )
    got = run(tmp_path, capsys, conf)
    assert got.routes()["~ ^/old/(.*)$"] == {"location": "~ ^/old/(.*)$", "return": {"code": 503}}
    opened = run(tmp_path, capsys, conf, "--allow-open")
    assert "~ ^/old/(.*)$" not in opened.routes() and "other routes serve these URIs" in opened.skipped("2")


def test_a_nested_regex_comes_before_the_servers_regexes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Elive's WordPress site (tests/nginx_corpus/wild/elive-for-servers): nginx tries the regexes nested in
    # the longest prefix (/phpmyadmin) before the server's, so /phpmyadmin/x.php is refused by the nested
    # location, not proxied by `~ \.php$`; appended after it, the refusal was never reached (fail open)
    got = run(
        tmp_path,
        capsys,
        "http { server { listen 8080;\n"
        f"  location ~ \\.php$ {{ {APP} }}\n"
        "  location /phpmyadmin { proxy_pass http://127.0.0.1:9001;\n"
        "    location ~ ^/phpmyadmin/(.+\\.php)$ { deny all; }\n"
        f"    location ~ ^/phpmyadmin/(.+\\.css)$ {{ {APP} }} }}\n"
        f"  location ~ \\.txt$ {{ {APP} }} }} }}\n",
    )
    assert [r["location"] for r in got.doc["routes"]] == [
        "~ ^/phpmyadmin/(.+\\.php)$", "~ ^/phpmyadmin/(.+\\.css)$", "~ \\.php$", "/phpmyadmin", "~ \\.txt$",
    ]  # fmt: skip
    assert got.routes()["~ ^/phpmyadmin/(.+\\.php)$"]["return"] == {"code": 403}
    assert "before the server's own regexes" in got.stderr


def test_request_id_and_server_name_are_imported_where_the_gateway_takes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = run(
        tmp_path,
        capsys,
        "http { log_format rid '$remote_addr $request_id \"$server_name\" $scheme'; access_log /dev/stdout rid;\n"
        " limit_req_zone $server_name zone=site:1m rate=10r/s;\n"
        " limit_req_zone $request_id zone=never:1m rate=1r/s;\n"
        " server { listen 8080; server_name a.test;\n"
        f"  location / {{ limit_req zone=site; proxy_set_header X-Request-ID $request_id; {APP}\n"
        "   add_header X-Request-ID $request_id always; } } }\n",
    )
    assert got.doc["log"]["format"] == '$remote_addr $request_id "$server_name" $scheme'
    assert got.doc["zones"]["site"]["key"] == "$server_name" and "never" not in got.doc["zones"]
    assert "$request_id is new for every request" in got.skipped("3")
    route = got.routes()["/"]
    assert route["proxy_set_header"] == {"X-Request-ID": "$request_id"}
    assert route["add_header"] == [{"name": "X-Request-ID", "value": "$request_id", "always": True}]


def test_implicit_upstreams_are_one_per_scheme_and_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    got = run(
        tmp_path,
        capsys,
        "http {\n upstream app { server 127.0.0.1:9002; }\n upstream b_81 { server 127.0.0.1:9003; }\n"
        " server { listen 8080;\n"
        "  location /ab/ { proxy_pass http://unix:/run/a/b.sock:/; }\n"
        "  location /a_b/ { proxy_pass http://unix:/run/a_b.sock:/; }\n"  # sanitises alike: not the same socket
        "  location /tls/ { proxy_pass https://unix:/run/a/b.sock:/; }\n"  # TLS to the first socket only here
        "  location /again/ { proxy_pass http://unix:/run/a/b.sock:/x/; }\n"
        "  location /tcp/ { proxy_pass http://127.0.0.1:9000; }\n"
        "  location /tcps/ { proxy_pass https://127.0.0.1:9000; }\n"
        "  location /b/ { proxy_pass http://b_81; }\n  location /b81/ { proxy_pass http://b:81; }\n"
        "  location /app/ { proxy_pass http://app; }\n  location /apps/ { proxy_pass https://app; }\n"
        "  location /app2/ { proxy_pass http://app; }\n }\n}\n",
    )
    assert got.code == 0, got.stderr
    ups, routes = got.doc["upstreams"], got.routes()
    used = {where: routes[where]["upstream"] for where in routes}
    server = {where: (ups[name]["servers"], ups[name].get("scheme", "http")) for where, name in used.items()}
    assert server == {
        "/ab/": (["unix:/run/a/b.sock"], "http"),
        "/a_b/": (["unix:/run/a_b.sock"], "http"),
        "/tls/": (["unix:/run/a/b.sock"], "https"),
        "/again/": (["unix:/run/a/b.sock"], "http"),
        "/tcp/": (["127.0.0.1:9000"], "http"),
        "/tcps/": (["127.0.0.1:9000"], "https"),
        "/b/": (["127.0.0.1:9003"], "http"),
        "/b81/": (["b:81"], "http"),  # not the block its name sanitises to
        "/app/": (["127.0.0.1:9002"], "http"),
        "/apps/": (["127.0.0.1:9002"], "https"),
        "/app2/": (["127.0.0.1:9002"], "http"),
    }
    assert used["/ab/"] == used["/again/"] == "unix__run_a_b.sock" and used["/a_b/"] == "unix__run_a_b.sock_2"
    assert used["/app/"] == used["/app2/"] == "app" and used["/apps/"] == "app_https" and used["/b81/"] == "b_81_2"
    assert "&id" not in got.text  # a copied block is written out whole, not as a YAML alias
