"""One Redis, one OpenResty-style nginx node and one gateway node, shared by the interop tests.

Both nodes use the same Redis with an empty key prefix, so a zone ``Z`` and a client key ``K``
are the Redis key ``Z:K`` on both sides (``$binary_remote_addr`` is ``\\x7f\\x00\\x00\\x01`` for
127.0.0.1 on both). Every test uses zones of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Gateway, Upstream, free_port
from tests.interop.openresty import OpenResty, find_openresty, http_get
from tests.redis_procs import RedisServer

# zone -> (gateway zone settings, route path); every route: burst 2, nodelay
ZONES: dict[str, tuple[str, str]] = {
    "interop_shared": ("rate: 2r/s", "/shared/"),
    "interop_fmt": ("rate: 1r/m", "/fmt/"),
    "interop_ban_a": ("rate: 2r/s, ban: 3s", "/ban_a/"),
    "interop_ban_b": ("rate: 2r/s, ban: 3s", "/ban_b/"),
    "interop_argv": ("rate: 30r/m", "/argv/"),
    "interop_noscript": ("rate: 2r/s", "/noscript/"),
}


def script_path() -> Path:
    """limit_req.lua in the checkout's scripts/lua (the file OpenResty nodes load)."""
    return Path(__file__).resolve().parents[2] / "scripts" / "lua" / "limit_req.lua"


def gateway_config(port: int, redis_port: int, upstream: str) -> str:
    zones = "\n".join(
        f"  {zone}: {{type: req, key: $binary_remote_addr, {settings}}}" for zone, (settings, _) in ZONES.items()
    )
    routes = "\n".join(
        f"  - location: {path}\n    upstream: app\n    limit_req: [{{zone: {zone}, burst: 2, nodelay: true}}]"
        for zone, (_, path) in ZONES.items()
    )
    return f"""
listen: 127.0.0.1:{port}
admin: {{listen: off}}
log: {{format: json}}
store:
  redis: {{url: "redis://127.0.0.1:{redis_port}/0", timeout: 500ms, on_error: deny, prefix: ""}}
zones:
{zones}
upstreams:
  app: {{servers: [{upstream}]}}
routes:
{routes}
"""


@pytest.fixture(scope="module")
def openresty(redis_session: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenResty]:
    binary, modules = find_openresty()
    node = OpenResty(binary, modules, tmp_path_factory.mktemp("openresty"), redis_session.port, script_path())
    node.start()
    yield node
    node.stop()


@pytest.fixture(scope="module")
def interop_gateway(
    redis_session: RedisServer, openresty: OpenResty, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    up = Upstream("interop").start()
    port = free_port()
    gw = Gateway(tmp_path_factory.mktemp("interop-gateway"), gateway_config(port, redis_session.port, up.address), port)
    try:
        gw.start()
        # Warm both nodes up (connections, script loads) so that timed requests are not the first.
        http_get(port, "/shared/?rid=warmup")
        openresty.limit("interop_shared")
        redis_session.command("DEL", b"interop_shared:\x7f\x00\x00\x01")
        yield gw
    finally:
        gw.stop()
        up.stop()
