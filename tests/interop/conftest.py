"""One Redis, one OpenResty-style nginx node and one gateway node, shared by the interop tests.

Both nodes use the same Redis with an empty key prefix, so a zone ``Z`` and a client key ``K``
are the Redis key ``Z:K`` on both sides (``$binary_remote_addr`` is ``\\x7f\\x00\\x00\\x01`` for
127.0.0.1 on both). Every test uses zones of its own.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.gateway import Gateway
from tests.support.openresty import OpenResty, find_openresty, gateway_config, http_get, script_path
from tests.support.ports import free_port
from tests.support.redis_procs import RedisServer
from tests.support.upstreams import Upstream


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
