from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers import Gateway, Upstream, free_port
from tests.redis_procs import RedisCluster, RedisSentinelSet, RedisServer, require_redis_binaries

# For every test: "redis_server" (a server of the test's own, free to be killed and
# restarted) and "redis_server_factory" (servers with their own options).
from tests.redis_procs import redis_server as _redis_server_fixture  # noqa: F401
from tests.redis_procs import redis_server_factory as _redis_server_factory_fixture  # noqa: F401


@pytest.fixture(scope="session")
def redis_session() -> Iterator[RedisServer]:
    """One redis-server for tests that isolate themselves with a key prefix."""
    require_redis_binaries()
    server = RedisServer()
    try:
        yield server.start()
    finally:
        server.close()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """3 masters on loopback for the whole session; tests isolate with key prefixes."""
    require_redis_binaries()
    cluster = RedisCluster(3, 0, base_dir=tmp_path_factory.mktemp("redis-cluster"))
    try:
        yield cluster.start()
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def redis_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisSentinelSet]:
    """A master, a replica and a sentinel ("mymaster"); a test that fails over heals it after."""
    require_redis_binaries()
    sentinels = RedisSentinelSet(1, base_dir=tmp_path_factory.mktemp("redis-sentinel"))
    try:
        yield sentinels.start()
    finally:
        sentinels.close()


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream("up1").start()
    yield up
    up.stop()


@pytest.fixture
def upstream2() -> Iterator[Upstream]:
    up = Upstream("up2").start()
    yield up
    up.stop()


@pytest.fixture
def gateway_factory(tmp_path: Path) -> Iterator[Callable[..., Gateway]]:
    started: list[Gateway] = []

    def make(
        config: str | Callable[[int], str],
        *,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        port: int | None = None,
        start: bool = True,
    ) -> Gateway:
        chosen = port
        for attempt in range(2):
            port = chosen or free_port()
            text = config(port) if callable(config) else config
            workdir = tmp_path / f"gw{len(started)}"
            workdir.mkdir()
            gw = Gateway(workdir, text, port, extra_args=extra_args, env=env)
            started.append(gw)
            if not start:
                return gw
            try:
                return gw.start()
            except RuntimeError as exc:
                # A free port can be taken by someone else before the gateway binds it: with
                # a port of our choosing (a config built from it), try once more on another.
                if attempt or chosen or not callable(config) or "Address already in use" not in str(exc):
                    raise
        raise AssertionError("unreachable")

    yield make
    for gw in started:
        gw.stop()
