"""``maps:`` and ``geo:`` end to end: the idioms nginx users rate-limit with, through the CLI.

* the allowlist: ``geo $limited { default 1; <internal> 0; }`` and
  ``map $limited $limit_key { 0 ""; 1 $binary_remote_addr; }``: internal clients are never
  counted (an empty key), the others are limited per address;
* a POST-only zone: ``map $request_method $post_key { POST $binary_remote_addr; default ""; }``;
* a per-user-agent key: crawlers limited per user agent, browsers not at all.

"Internal" addresses are a sub-range of 127.0.0.0/8: the clients bind their sockets to
127.0.0.x addresses, so the gateway sees each as a different client.
"""

from __future__ import annotations

import aiohttp

from tests.support.config import config
from tests.support.http import Reply, request
from tests.support.upstreams import Upstream

TOP = 'shutdown_timeout: 5s\nlog: {format: json}\nadmin: {listen: "off"}'


async def from_address(source: str, url: str, method: str = "GET", **kwargs: object) -> Reply:
    """One request over a new connection whose client address is ``source`` (a 127.0.0.0/8 one)."""
    connector = aiohttp.TCPConnector(force_close=True, local_addr=(source, 0))
    async with aiohttp.ClientSession(connector=connector) as session:
        return await request(method, url, session=session, **kwargs)  # type: ignore[arg-type]


ALLOWLIST = """
geo:
  limited:
    default: "1"
    values:
      127.0.0.0/29: "0"        # the "internal" clients: 127.0.0.1 .. 127.0.0.7
      127.0.0.5/32: "1"        # except this one: the longest prefix wins
maps:
  limit_key:
    source: $limited
    values:
      "0": ""
      "1": $binary_remote_addr
"""


async def test_allowlist_internal_clients_are_never_counted(gateway_factory, upstream: Upstream):
    gw = gateway_factory(
        config(
            upstream,
            top=TOP + ALLOWLIST,
            zones="  per_ip: {type: req, key: $limit_key, rate: 1r/m}\n  conns: {type: conn, key: $limit_key}",
            route=(
                "    limit_req: [{zone: per_ip}]\n"
                "    limit_conn: [{zone: conns, max: 5}]\n"
                "    limit_req_status: 429\n"
                "    proxy_set_header: {X-Limited: $limited}\n"
                "    add_header: [{name: X-Limited, value: $limited}]\n"
            ),
        )
    )
    internal = [await from_address("127.0.0.2", gw.url + "/echo") for _ in range(4)]
    assert [r.status for r in internal] == [200, 200, 200, 200]
    assert all(r.headers["X-Limited"] == "0" for r in internal)
    outside = [await from_address("127.0.1.9", gw.url + "/echo") for _ in range(3)]
    assert [r.status for r in outside] == [200, 429, 429]
    assert outside[0].headers["X-Limited"] == "1"
    excepted = [await from_address("127.0.0.5", gw.url + "/echo") for _ in range(2)]
    assert [r.status for r in excepted] == [200, 429]
    other = await from_address("127.0.1.10", gw.url + "/echo")  # a key of its own
    assert other.status == 200
    sent = [dict(entry["headers"]).get("X-Limited") for entry in upstream.seen]
    assert sent == ["0"] * 4 + ["1", "1", "1"]
    statuses = [(e["remote_addr"], e["limit_req_status"]) for e in gw.access_json()]
    assert statuses[:4] == [("127.0.0.2", "")] * 4  # no key: not limited, no status, as in nginx
    assert statuses[4:] == [
        ("127.0.1.9", "PASSED"),
        ("127.0.1.9", "REJECTED"),
        ("127.0.1.9", "REJECTED"),
        ("127.0.0.5", "PASSED"),
        ("127.0.0.5", "REJECTED"),
        ("127.0.1.10", "PASSED"),
    ]


async def test_post_only_zone_counts_posts_and_never_gets(gateway_factory, upstream: Upstream):
    gw = gateway_factory(
        config(
            upstream,
            top=TOP
            + """
maps:
  post_key:
    source: $request_method
    default: ""
    values: {POST: $binary_remote_addr}
""",
            zones="  posts: {type: req, key: $post_key, rate: 1r/m}",
            route="    limit_req: [{zone: posts}]",
        )
    )
    gets = [await from_address("127.0.2.1", gw.url + "/echo") for _ in range(5)]
    assert [r.status for r in gets] == [200] * 5
    posts = [await from_address("127.0.2.1", gw.url + "/echo", "POST", data=b"x") for _ in range(3)]
    assert [r.status for r in posts] == [200, 503, 503]
    assert (await from_address("127.0.2.1", gw.url + "/echo")).status == 200  # GETs still pass
    assert (await from_address("127.0.2.2", gw.url + "/echo", "POST", data=b"x")).status == 200  # another client
    log = gw.access_json()
    assert [e["limit_req_status"] for e in log if e["request_method"] == "GET"] == [""] * 6


async def test_per_user_agent_key_limits_each_crawler_and_no_browser(gateway_factory, upstream: Upstream):
    gw = gateway_factory(
        config(
            upstream,
            top=TOP
            + """
maps:
  bot_key:
    source: $http_user_agent
    default: ""
    values:
      "~*(bot|crawler|spider)": $http_user_agent
""",
            zones="  bots: {type: count, key: $bot_key, limit: 2, window: 60s}",
            route="    limit_count: [{zone: bots}]",
        )
    )

    async def as_agent(agent: str, source: str = "127.0.3.1") -> int:
        return (await from_address(source, gw.url + "/echo", headers={"User-Agent": agent})).status

    assert [await as_agent("Mozilla/5.0 (X11; Linux x86_64)") for _ in range(5)] == [200] * 5
    googlebot = "Mozilla/5.0 (compatible; Googlebot/2.1)"
    # one crawler, from any address: one key
    assert [await as_agent(googlebot, f"127.0.3.{i}") for i in (1, 2, 3)] == [200, 200, 429]
    assert [await as_agent("SomeSpider/1.0") for _ in range(3)] == [200, 200, 429]
    assert await as_agent("Mozilla/5.0 (X11; Linux x86_64)") == 200
