"""Fixtures for every test, and the markers that follow from a test's folder and fixtures.

Markers are never written by hand for what they can be told from: the ``pytest_collection_modifyitems``
hook below gives ``redis`` to everything under tests/redis/ and to every test that uses a Redis
fixture, ``nginx`` to everything under tests/differential/ and tests/interop/ (``redis`` too:
the OpenResty node and the gateway share one), and ``slow`` to tests/packaging/. What the hook
cannot see is written by hand: ``slow`` elsewhere, a Redis reached through
``request.getfixturevalue`` (mark the parameter) or a process a test starts itself.

Redis: ``redis_session`` is one server for the whole run (tests isolate with a key prefix);
``redis_server`` a server of the test's own, free to be killed, paused and restarted;
``redis_server_factory`` servers with options of the test's choosing; ``redis_cluster`` and
``redis_sentinel`` one cluster and one Sentinel set for the run (a test that breaks them
heals them after).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.gateway import Gateway
from tests.support.ports import free_port
from tests.support.redis_procs import RedisCluster, RedisSentinelSet, RedisServer, require_redis_binaries
from tests.support.upstreams import Upstream

TESTS = Path(__file__).resolve().parent

REDIS_FIXTURES = frozenset({"redis_session", "redis_server", "redis_server_factory", "redis_cluster", "redis_sentinel"})
FOLDER_MARKS = {"redis": ("redis",), "differential": ("nginx",), "interop": ("nginx", "redis"), "packaging": ("slow",)}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        try:
            folder = item.path.relative_to(TESTS).parts[0]
        except ValueError:
            continue
        names = set(FOLDER_MARKS.get(folder, ()))
        if REDIS_FIXTURES & set(getattr(item, "fixturenames", ())):
            names.add("redis")
        for name in sorted(names - {m.name for m in item.iter_markers()}):
            item.add_marker(name)


# -- Redis -----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for tests that isolate themselves with a key prefix."""
    require_redis_binaries()
    server = RedisServer(base_dir=tmp_path_factory.mktemp("redis-session"))
    try:
        yield server.start()
    finally:
        server.close()


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A fresh standalone redis-server for one test, which may kill, pause or restart it."""
    require_redis_binaries()
    server = RedisServer(base_dir=tmp_path_factory.mktemp("redis"))
    try:
        yield server.start()
    finally:
        server.close()


@pytest.fixture
def redis_server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., RedisServer]]:
    """``make(**RedisServer kwargs)`` -> a started server; all are stopped after the test."""
    require_redis_binaries()
    base = tmp_path_factory.mktemp("redis-many")
    made: list[RedisServer] = []

    def make(**kwargs: Any) -> RedisServer:
        kwargs.setdefault("base_dir", base)
        server = RedisServer(**kwargs)
        made.append(server)
        return server.start()

    try:
        yield make
    finally:
        for server in made:
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


# -- upstreams and the gateway ---------------------------------------------------------------------


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
    """``make(config)`` -> a started gateway (its CLI); ``config`` is YAML text or a function of
    the listen port (tests/support/config.py). All are stopped after the test."""
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
