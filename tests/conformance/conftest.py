"""One behavioural suite for every store: the same vectors, the same fake clock.

The ``store`` fixture is parametrised; a store joins the suite by adding itself to
``STORES`` (the Redis stores are the ``redis*`` entries, marked ``redis``).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gateway.store.base import Store
from gateway.store.memory import MemoryStore
from tests.support.conformance import FakeClock


async def _memory(clock: FakeClock, request: Any) -> AsyncIterator[Store]:
    yield MemoryStore(clock_ms=clock)


async def _redis(clock: FakeClock, request: Any) -> AsyncIterator[Store]:
    from gateway.config.store import RedisSpec
    from gateway.store.redis import RedisStore

    server = request.getfixturevalue("redis_session")
    prefix = f"t{uuid.uuid4().hex[:12]}:"
    store = RedisStore(RedisSpec(url=server.url, timeout_ms=2000, on_error="allow", prefix=prefix), clock_ms=clock)
    await store.start()
    yield store


async def _redis_general(clock: FakeClock, request: Any) -> AsyncIterator[Store]:
    """The Redis store with its short path for routes whose every limit has a key turned off:
    every reply then goes through the general merge, and both ways must agree."""
    async for store in _redis(clock, request):
        store.full_calls = False  # type: ignore[attr-defined]
        yield store


async def _redis_cluster(clock: FakeClock, request: Any) -> AsyncIterator[Store]:
    from gateway.config.store import RedisSpec
    from gateway.store.redis import RedisStore

    cluster = request.getfixturevalue("redis_cluster")
    prefix = f"t{uuid.uuid4().hex[:12]}:"
    spec = RedisSpec(cluster=tuple(cluster.seed_urls), timeout_ms=2000, on_error="allow", prefix=prefix)
    store = RedisStore(spec, clock_ms=clock)
    await store.start()
    yield store


STORES: dict[str, Callable[[FakeClock, Any], AsyncIterator[Store]]] = {
    "memory": _memory,
    "redis": _redis,
    "redis_general": _redis_general,
    "redis_cluster": _redis_cluster,
}
ENGINE = {
    "memory": "nginx",
    "redis": "resty",
    "redis_general": "resty",
    "redis_cluster": "resty",
}  # the arithmetic a store follows: nginx (integer) or resty (float)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(
    params=[
        pytest.param(name, marks=[pytest.mark.redis] if name.startswith("redis") else []) for name in sorted(STORES)
    ]
)
async def store(request: pytest.FixtureRequest, clock: FakeClock) -> AsyncIterator[Store]:
    factory = STORES[request.param]
    async for s in factory(clock, request):
        s.engine = ENGINE[request.param]  # type: ignore[attr-defined]
        yield s
        await s.close()
