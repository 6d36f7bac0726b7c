"""``map`` and ``geo`` keys and ``if``-return guards against the real nginx: the same requests, the same answers.

One nginx and one gateway, configured with the same three idioms (the allowlist of ``geo`` +
``map``, a POST-only zone, a per-user-agent key) plus variables shown in ``add_header``; the
same schedule goes to both, each request from its own client address in 127.0.0.0/8. Rates are
1r/m, so no decision depends on timing: statuses and headers must be equal request by request.
The gateway's configuration is written by hand once, and once is what ``import-nginx`` makes of
nginx's own; a second nginx configuration adds the guards (``if (...) { return ...; }`` at
server and location level, on map variables too, ``return 444``), imported the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.support.gateway import Gateway
from tests.support.importing import PROCESS_ONLY, imported_yaml
from tests.support.nginx import NginxProcess, find_nginx
from tests.support.ports import free_port
from tests.support.upstreams import Upstream

HEAD = """daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events { worker_connections 256; }
http {
    client_body_temp_path {d}/client_body_temp;
    proxy_temp_path {d}/proxy_temp;
    fastcgi_temp_path {d}/fastcgi_temp;
    uwsgi_temp_path {d}/uwsgi_temp;
    scgi_temp_path {d}/scgi_temp;
    access_log off;"""  # every nginx.conf here starts so: nginx run from the test's directory


def nginx_conf(d: Path, port: int, upstream: str) -> str:
    return (
        HEAD.replace("{d}", str(d))
        + f"""
    geo $limited {{ default 1; 127.0.0.0/29 0; 127.0.0.5/32 1; }}
    map $limited $limit_key {{ 0 ""; 1 $binary_remote_addr; }}
    map $request_method $post_key {{ POST $binary_remote_addr; default ""; }}
    map $http_user_agent $bot_key {{ default ""; "~*(bot|crawler|spider)" $http_user_agent; }}
    map $http_user_agent $agent_class {{ default human; "~*(?<kind>bot|spider)" "robot-$kind"; Curl/8 tool; }}
    map "$request_method:$limited" $pair {{ "GET:0" internal-get; default "other"; }}
    limit_req_zone $limit_key zone=allow:1m rate=1r/m;
    limit_req_zone $post_key zone=posts:1m rate=1r/m;
    limit_req_zone $bot_key zone=bots:1m rate=1r/m;
    limit_req_status 429;
    server {{
        listen 127.0.0.1:{port};
        location /allow/ {{
            limit_req zone=allow;
            add_header X-Limited $limited always;
            add_header X-Pair $pair always;
            proxy_pass http://{upstream};
        }}
        location /post/ {{ limit_req zone=posts; proxy_pass http://{upstream}; }}
        location /ua/ {{
            limit_req zone=bots;
            add_header X-Class $agent_class always;
            proxy_pass http://{upstream};
        }}
    }}
}}
"""
    )


def gateway_yaml(port: int, upstream: str) -> str:
    return f"""
listen: 127.0.0.1:{port}
admin: {{listen: "off"}}
shutdown_timeout: 2s
geo:
  limited:
    default: "1"
    values: {{127.0.0.0/29: "0", 127.0.0.5/32: "1"}}
maps:
  limit_key: {{source: $limited, values: {{"0": "", "1": $binary_remote_addr}}}}
  post_key: {{source: $request_method, default: "", values: {{POST: $binary_remote_addr}}}}
  bot_key: {{source: $http_user_agent, default: "", values: {{"~*(bot|crawler|spider)": $http_user_agent}}}}
  agent_class:
    source: $http_user_agent
    default: human
    values: {{"~*(?<kind>bot|spider)": "robot-$kind", Curl/8: tool}}
  pair: {{source: "$request_method:$limited", default: other, values: {{"GET:0": internal-get}}}}
zones:
  allow: {{type: req, key: $limit_key, rate: 1r/m}}
  posts: {{type: req, key: $post_key, rate: 1r/m}}
  bots: {{type: req, key: $bot_key, rate: 1r/m}}
upstreams:
  app: {{servers: [{upstream}]}}
defaults:
  limit_req_status: 429
routes:
  - location: /allow/
    upstream: app
    limit_req: [{{zone: allow}}]
    add_header:
      - {{name: X-Limited, value: $limited, always: true}}
      - {{name: X-Pair, value: $pair, always: true}}
  - location: /post/
    upstream: app
    limit_req: [{{zone: posts}}]
  - location: /ua/
    upstream: app
    limit_req: [{{zone: bots}}]
    add_header: [{{name: X-Class, value: $agent_class, always: true}}]
"""


# (client address, method, path, User-Agent)
SCHEDULE = [
    ("127.0.0.2", "GET", "/allow/a", "x"),  # internal: never counted
    ("127.0.0.2", "GET", "/allow/b", "x"),
    ("127.0.0.2", "POST", "/allow/c", "x"),
    ("127.0.0.5", "GET", "/allow/d", "x"),  # the /32 exception inside the internal /29
    ("127.0.0.5", "GET", "/allow/e", "x"),
    ("127.0.1.9", "GET", "/allow/f", "x"),  # outside: one per minute
    ("127.0.1.9", "GET", "/allow/g", "x"),
    ("127.0.1.10", "GET", "/allow/h", "x"),
    ("127.0.2.1", "GET", "/post/a", "x"),  # GETs are never counted by the POST-only zone
    ("127.0.2.1", "GET", "/post/b", "x"),
    ("127.0.2.1", "POST", "/post/c", "x"),
    ("127.0.2.1", "POST", "/post/d", "x"),
    ("127.0.2.2", "POST", "/post/e", "x"),
    ("127.0.3.1", "GET", "/ua/a", "Mozilla/5.0 (X11)"),  # browsers: no key
    ("127.0.3.1", "GET", "/ua/b", "Mozilla/5.0 (X11)"),
    ("127.0.3.1", "GET", "/ua/c", "Mozilla/5.0 (compatible; Googlebot/2.1)"),
    ("127.0.3.2", "GET", "/ua/d", "Mozilla/5.0 (compatible; Googlebot/2.1)"),  # same agent, other address
    ("127.0.3.1", "GET", "/ua/e", "SomeSpider/1.0"),
    ("127.0.3.1", "GET", "/ua/f", "curl/8"),  # exact keys ignore case
]


def _headers(agent: str) -> dict[str, str]:
    """``agent`` is the User-Agent, then "|" and a Referer if any; "token" in it sends an X-Token."""
    agent, _, referer = agent.partition("|")
    out = {"User-Agent": agent, **({"X-Token": "t"} if "token" in agent else {})}
    return out | ({"Referer": referer} if referer else {})


async def run(port: int, schedule: list[tuple[str, str, str, str]] = SCHEDULE) -> list[tuple[int, str, str, str]]:
    """Each request's status (0: the connection closed without a response) and the headers shown."""
    answers = []
    for source, method, path, agent in schedule:
        connector = aiohttp.TCPConnector(force_close=True, local_addr=(source, 0))
        async with aiohttp.ClientSession(connector=connector) as session:
            try:
                async with session.request(
                    method,
                    f"http://127.0.0.1:{port}{path}",
                    headers=_headers(agent),
                    data=b"x",
                    allow_redirects=False,
                ) as resp:
                    body = await resp.read()
                    h = resp.headers
                    # a return's own text (the guards' start with "!"), a redirect's Location, or X-Pair
                    shown = body.decode() if body.startswith(b"!") else h.get("Location", h.get("X-Pair", "-"))
                    answers.append((resp.status, h.get("X-Limited", "-"), shown, h.get("X-Class", "-")))
            except aiohttp.ServerDisconnectedError:
                answers.append((0, "-", "-", "-"))
    return answers


def side_by_side(
    tmp_path: Path,
    conf: Callable[[Path, int, str], str],
    schedule: list[tuple[str, str, str, str]],
    by_hand: Callable[[int, str], str] | None = None,
) -> tuple[list[tuple[int, str, str, str]], list[tuple[int, str, str, str]], str]:
    """nginx on ``conf`` and the gateway on ``by_hand`` (or, when None, on what import-nginx makes of
    ``conf``), the same schedule to each: their answers, and the gateway's configuration."""
    binary = find_nginx()
    if binary is None:
        pytest.skip("nginx binary not found (differential tests need it)")
    upstream = Upstream("mapgeo").start()
    nginx_dir, gateway_dir = tmp_path / "nginx", tmp_path / "gateway"
    nginx_dir.mkdir()
    gateway_dir.mkdir()
    nginx_port, gateway_port = free_port(), free_port()
    conf_text = conf(nginx_dir, nginx_port, upstream.address)
    if by_hand is None:
        (nginx_dir / "nginx.conf").write_text(conf_text)
        gateway_text, skipped = imported_yaml(nginx_dir / "nginx.conf", gateway_port)
        assert set(skipped) <= PROCESS_ONLY | {"access_log"}, skipped
    else:
        gateway_text = by_hand(gateway_port, upstream.address)
    nginx = NginxProcess(binary, nginx_dir, conf_text, nginx_port)
    gateway = Gateway(gateway_dir, gateway_text, gateway_port)
    try:
        nginx.start()
        gateway.start()
        from_nginx = asyncio.run(run(nginx_port, schedule))
        from_gateway = asyncio.run(run(gateway_port, schedule))
    finally:
        gateway.stop()
        nginx.stop()
        upstream.stop()
    return from_nginx, from_gateway, gateway_text


@pytest.mark.timing
@pytest.mark.parametrize("imported", [False, True], ids=["by-hand", "imported"])
def test_map_and_geo_keys_decide_like_nginx(tmp_path: Path, imported: bool) -> None:
    from_nginx, from_gateway, text = side_by_side(tmp_path, nginx_conf, SCHEDULE, None if imported else gateway_yaml)
    if imported:  # what import-nginx wrote: the same maps and geo as by hand
        doc = yaml.safe_load(text)
        assert set(doc["maps"]) == {"limit_key", "post_key", "bot_key", "agent_class", "pair"}
        assert doc["geo"]["limited"] == {"default": "1", "values": {"127.0.0.0/29": "0", "127.0.0.5/32": "1"}}
        assert {z["key"] for z in doc["zones"].values()} == {"$limit_key", "$post_key", "$bot_key"}
    assert [a[0] for a in from_nginx] == [
        *(200, 200, 200, 200, 429, 200, 429, 200),
        *(200, 200, 200, 429, 200),
        *(200, 200, 200, 429, 200, 200),
    ]
    assert from_nginx[0][1:] == ("0", "internal-get", "-") and from_nginx[2][2] == "other"
    assert [a[3] for a in from_nginx[13:]] == ["human", "human", "robot-bot", "robot-bot", "robot-Spider", "tool"]
    assert from_gateway == from_nginx


def guards_conf(d: Path, port: int, upstream: str) -> str:
    return (
        HEAD.replace("{d}", str(d))
        + f"""
    map $http_user_agent $bad_bot {{ default 0; "~*(sqlmap|nikto)" 1; ~*masscan 2; }}
    map $bad_bot $why {{ 1 "scanner"; default "other"; }}
    geo $inside {{ default 0; 127.0.4.0/24 1; }}
    limit_req_zone $binary_remote_addr zone=ip:1m rate=1r/m;
    limit_req_status 429;
    server {{
        listen 127.0.0.1:{port};
        if ($request_method !~ ^(GET|HEAD|POST)$) {{ return 405; }}
        if ($bad_bot = 2) {{ return 444; }}
        if ($bad_bot) {{ return 403 "!no $why"; }}
        location / {{
            if ($request_uri ~ "/\\.git") {{ return 403; }}
            if ($http_x_token = '') {{ return 401 "!token please"; }}
            if ($inside) {{ return 302 https://inside.test$request_uri; }}
            limit_req zone=ip;
            proxy_pass http://{upstream};
        }}
        location /old/ {{
            if ($arg_keep != "1") {{ return 301 https://new.test$uri; }}
            return 410;
        }}
    }}
}}
"""
    )


# (client address, method, path, User-Agent); X-Token is sent when the agent says "token"
GUARDS_SCHEDULE = [
    ("127.0.5.1", "DELETE", "/a", "token"),  # the server's rule answers: nothing taken from the zone
    ("127.0.5.1", "GET", "/a", "token"),
    ("127.0.5.1", "GET", "/b", "token"),  # 1r/m: refused
    ("127.0.5.2", "GET", "/r/.git/config", "token"),  # a location rule before the limits
    ("127.0.5.2", "GET", "/c", "token"),
    ("127.0.5.3", "GET", "/c", "x"),  # no X-Token: 401, before the limits
    ("127.0.5.3", "GET", "/d", "token"),
    ("127.0.5.4", "GET", "/e", "sqlmap/1.7 token"),  # a map variable in a server rule and its text
    ("127.0.5.4", "GET", "/e", "Masscan/1.3 token"),  # 444: closed without a response
    ("127.0.4.9", "GET", "/f?x=1", "token"),  # geo in a rule: a redirect
    ("127.0.5.5", "GET", "/old/p?keep=0", "token"),
    ("127.0.5.5", "GET", "/old/p?keep=1", "token"),
]


@pytest.mark.timing
def test_imported_if_return_guards_decide_like_nginx(tmp_path: Path) -> None:
    from_nginx, from_gateway, text = side_by_side(tmp_path, guards_conf, GUARDS_SCHEDULE)
    doc = yaml.safe_load(text)
    assert [r["if"] for r in doc["rules"]] == ["$request_method !~ ^(GET|HEAD|POST)$", "$bad_bot = 2", "$bad_bot"]
    assert [a[0] for a in from_nginx] == [405, 200, 429, 403, 200, 401, 200, 403, 0, 302, 301, 410]
    assert (
        from_nginx[5][2] == "!token please"
        and from_nginx[7][2] == "!no scanner"
        and from_nginx[9][2] == "https://inside.test/f?x=1"
    )
    assert from_gateway == from_nginx


BOTS_D = Path(__file__).resolve().parents[1] / "nginx_corpus" / "wild" / "nginx-ultimate-bad-bot-blocker" / "bots.d"


def bot_blocker_conf(d: Path, port: int, upstream: str) -> str:
    """The bot blocker's own server includes (blockbots.conf, ddos.conf, from the corpus, as the project
    says to include them), with a few lines of what its globalblacklist.conf defines, in its form."""
    return (
        HEAD.replace("{d}", str(d))
        + f"""
    map $http_user_agent $bad_bot {{
        default 0;
        "~*(?:\\b)360Spider(?:\\b)" 3;
        "~*(?:\\b)AhrefsBot(?:\\b)" 2;
        "~*(?:\\b)Googlebot(?:\\b)" 0;
    }}
    map $http_referer $bad_words {{ default 0; "~*(?:\\b)casino(?:\\b)" 1; }}
    map $http_referer $bad_referer {{ hostnames; default 0; "~*(?:\\b)spam-site\\.test(?:\\b)" 1; }}
    map $request_uri $bad_uri_words {{ default 0; "~*(?:\\b)(wp-config\\.php)(?:\\b)" 1; }}
    geo $validate_client {{ default 0; 127.0.6.0/24 1; }}
    map $bad_bot $bot_iplimit {{ 0 ""; 1 ""; 2 $binary_remote_addr; 3 $binary_remote_addr; }}
    limit_conn_zone $bot_iplimit zone=bot2_connlimit:16m;
    limit_req_zone $bot_iplimit zone=bot2_reqlimitip:16m rate=1r/m;
    limit_conn_zone $binary_remote_addr zone=addr:50m;
    limit_req_zone $binary_remote_addr zone=flood:50m rate=90r/s;
    server {{
        listen 127.0.0.1:{port};
        include {BOTS_D}/blockbots.conf;
        include {BOTS_D}/ddos.conf;
        location / {{ proxy_pass http://{upstream}; }}
    }}
}}
"""
    )


BOT_SCHEDULE = [
    ("127.0.7.1", "GET", "/a", "Mozilla/5.0"),
    ("127.0.7.1", "GET", "/b", "Mozilla/5.0 (compatible; Googlebot/2.1)"),
    ("127.0.7.2", "GET", "/c", "Mozilla/5.0 (compatible; 360Spider)"),  # $bad_bot = '3': 444
    ("127.0.7.3", "GET", "/d", "Mozilla/5.0|https://casino.test/"),  # $bad_words
    ("127.0.7.3", "GET", "/e", "Mozilla/5.0|http://www.spam-site.test/x"),  # $bad_referer
    ("127.0.7.4", "GET", "/wp-config.php?x", "Mozilla/5.0"),  # $bad_uri_words
    ("127.0.6.9", "GET", "/f", "Mozilla/5.0"),  # $validate_client (geo)
    ("127.0.7.5", "GET", "/g", "AhrefsBot/7.0"),  # rate-limited bots: keyed by address, 1r/m, burst 10
    ("127.0.7.5", "HEAD", "/h", "Mozilla/5.0"),
]


@pytest.mark.timing
def test_the_bot_blocker_imported_decides_like_nginx(tmp_path: Path) -> None:
    from_nginx, from_gateway, text = side_by_side(tmp_path, bot_blocker_conf, BOT_SCHEDULE)
    doc = yaml.safe_load(text)
    assert [r["if"] for r in doc["rules"]] == [
        "$bad_bot = '3'", "$bad_words", "$bad_referer", "$bad_uri_words", "$validate_client"
    ]  # fmt: skip
    assert {"bot2_reqlimitip", "flood"} <= {z["zone"] for z in doc["routes"][0]["limit_req"]}
    assert doc["zones"]["bot2_reqlimitip"]["key"] == "$bot_iplimit"
    assert [a[0] for a in from_nginx] == [200, 200, 0, 0, 0, 0, 0, 200, 200]
    assert from_gateway == from_nginx


def posix_conf(d: Path, port: int, upstream: str) -> str:
    return (
        HEAD.replace("{d}", str(d))
        + f"""
    map $http_user_agent $bad_bot {{ default 0; "~*^[[:alpha:]]+bot" 1; "~[^[:space:]]{{12}}" 2; }}
    server {{
        listen 127.0.0.1:{port};
        if ($bad_bot = 1) {{ return 403 "!bot"; }}
        if ($bad_bot) {{ return 403 "!long"; }}
        location / {{
            if ($request_uri ~ "^/[[:digit:]]+$") {{ return 403 "!digits"; }}
            if ($request_uri ~ "^/[[:alpha:]_-]+/[[:xdigit:]]{{4}}$") {{ return 403 "!hex"; }}
            proxy_pass http://{upstream};
        }}
    }}
}}
"""
    )


POSIX_SCHEDULE = [
    ("127.0.6.1", "GET", "/123", "x"),
    ("127.0.6.1", "GET", "/12a", "x"),
    ("127.0.6.1", "GET", "/a_b-c/beef", "x"),
    ("127.0.6.1", "GET", "/a_b-c/bee", "x"),
    ("127.0.6.1", "GET", "/a1/beef", "x"),
    ("127.0.6.1", "GET", "/p", "EvilBot/1"),
    ("127.0.6.1", "GET", "/p", "9bot"),
    ("127.0.6.1", "GET", "/p", "Mozilla/5.0/abc"),
    ("127.0.6.1", "GET", "/p", "Mozilla 5.0 (X11)"),
]


def test_imported_posix_classes_decide_like_nginx(tmp_path: Path) -> None:
    """PCRE's [[:digit:]], [^[:space:]], [[:alpha:]_-] in map keys and if conditions, imported."""
    from_nginx, from_gateway, text = side_by_side(tmp_path, posix_conf, POSIX_SCHEDULE)
    assert "[[:alpha:]]" in text  # the config keeps nginx's spelling; the gateway translates it when it loads
    assert [a[2] if a[0] == 403 else a[0] for a in from_nginx] == [
        *("!digits", 200, "!hex", 200, 200),
        *("!bot", 200, "!long", 200),
    ]
    assert from_gateway == from_nginx
