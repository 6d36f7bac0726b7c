"""A Redis client for the store that hides the topology and the client library.

``ScriptClient`` is all the store asks of Redis: run a script on keys of one slot,
load scripts, PING, and drop a connection that stopped answering.

* ``RespScriptClient``: a standalone Redis (``url``) through our own pipelined RESP
  connection (``gateway/store/resp.py``): one socket, no pool, commands pre-encoded.
* ``RedisPyScriptClient``: Redis Cluster and Sentinel through redis-py, which
  follows slots, redirections and failovers.

``connect`` builds the redis-py client for any topology (bans and pub/sub use it too).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError

from gateway.config.store import RedisSpec
from gateway.store.resp import NoScript, RespClient, RespError, encode_keys

# What a failed call raises, whichever library made it.
CALL_ERRORS: tuple[type[BaseException], ...] = (TimeoutError, RedisError, RespError, OSError)
NO_SCRIPT: tuple[type[BaseException], ...] = (NoScriptError, NoScript)
ERROR_REPLY: tuple[type[BaseException], ...] = (ResponseError, RespError)


class ScriptClient(Protocol):
    cluster: bool
    encoded: bool  # True: evalsha takes its arguments RESP-encoded (args_bytes), else as a list

    async def evalsha(self, sha: str, keys: Sequence[bytes], args: Sequence[Any], args_bytes: bytes, nargs: int) -> Any:
        """EVALSHA of ``keys`` and ``nargs`` arguments: ``args`` or ``args_bytes`` (see ``encoded``)."""
        ...

    def send_now(
        self, sha: str, keys: Sequence[bytes], args: Sequence[Any], args_bytes: bytes, nargs: int
    ) -> asyncio.Future[Any] | None:
        """EVALSHA written at once on an open connection, its reply a future; None: use ``evalsha``."""
        ...

    async def load(self, source: str) -> None: ...

    async def ping(self) -> None: ...

    def slot(self, key: bytes) -> int:
        """The group a key's calls are batched in: its cluster slot, or 0."""
        ...

    def abort(self, reason: str) -> None:
        """A call got no reply in time: drop the connection it waits on."""
        ...

    async def close(self) -> None: ...


class RespScriptClient:
    """A standalone Redis over one pipelined connection; arguments sent as pre-encoded bytes."""

    cluster = False
    encoded = True

    def __init__(self, url: str, timeout: float) -> None:
        self.resp = RespClient(url, timeout)

    async def evalsha(self, sha: str, keys: Sequence[bytes], args: Sequence[Any], args_bytes: bytes, nargs: int) -> Any:
        return await self.resp.call_encoded(self._command(sha, keys, args_bytes, nargs))

    def send_now(
        self, sha: str, keys: Sequence[bytes], args: Sequence[Any], args_bytes: bytes, nargs: int
    ) -> asyncio.Future[Any] | None:
        conn = self.resp.connection
        if conn is None or conn.closed:
            return None
        return conn.send_encoded(self._command(sha, keys, args_bytes, nargs))

    @staticmethod
    def _command(sha: str, keys: Sequence[bytes], args_bytes: bytes, nargs: int) -> bytes:
        nkeys = str(len(keys)).encode()
        head = b"*%d\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n$%d\r\n%s\r\n" % (
            3 + len(keys) + nargs,
            sha.encode(),
            len(nkeys),
            nkeys,
        )
        return head + encode_keys(keys) + args_bytes

    async def load(self, source: str) -> None:
        await self.resp.call("SCRIPT", "LOAD", source)

    async def ping(self) -> None:
        await self.resp.call("PING")

    def slot(self, key: bytes) -> int:
        return 0

    def abort(self, reason: str) -> None:
        self.resp.abort(reason)

    async def close(self) -> None:
        self.resp.close()


class RedisPyScriptClient:
    """Redis Cluster or Sentinel through redis-py (its pool, slot map and failover)."""

    encoded = False

    def __init__(self, spec: RedisSpec, timeout: float) -> None:
        self.cluster = bool(spec.cluster)
        self.client: Any = connect(spec, timeout)

    async def evalsha(self, sha: str, keys: Sequence[bytes], args: Sequence[Any], args_bytes: bytes, nargs: int) -> Any:
        return await self.client.evalsha(sha, len(keys), *keys, *args)

    def send_now(
        self, sha: str, keys: Sequence[bytes], args: Sequence[Any], args_bytes: bytes, nargs: int
    ) -> asyncio.Future[Any] | None:
        return None  # redis-py picks a connection (and a node) in a coroutine

    async def load(self, source: str) -> None:
        await self.client.script_load(source)

    async def ping(self) -> None:
        await self.client.ping()

    def slot(self, key: bytes) -> int:
        return int(self.client.keyslot(key)) if self.cluster else 0

    def abort(self, reason: str) -> None:
        pass  # redis-py drops a connection whose call was cancelled

    async def close(self) -> None:
        if self.cluster:
            await self.client.aclose()
        else:
            await self.client.aclose(close_connection_pool=True)


def script_client(spec: RedisSpec, timeout: float) -> ScriptClient:
    if spec.url and not spec.cluster and spec.sentinel is None:
        return RespScriptClient(spec.url, timeout)
    return RedisPyScriptClient(spec, timeout)


def slot_tags() -> list[bytes]:
    """For every cluster slot, a short hash tag that maps to it."""
    from redis.crc import key_slot

    tags: list[bytes | None] = [None] * 16384
    missing = 16384
    i = 0
    while missing:
        tag = format(i, "x").encode()
        slot = key_slot(b"{" + tag + b"}")
        if tags[slot] is None:
            tags[slot] = b"{" + tag + b"}"
            missing -= 1
        i += 1
    return tags  # type: ignore[return-value]


def connect(spec: RedisSpec, timeout: float | None) -> Any:
    """A redis-py asyncio client for the configured topology, with no retries."""
    options: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout if timeout is not None else 2.0,
        # One immediate retry on a broken connection (a pooled one that a Redis restart
        # closed); never on a timeout, which the breaker and on_error handle.
        "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        "health_check_interval": 0,
    }
    if spec.cluster:
        from redis.asyncio.cluster import ClusterNode
        from redis.asyncio.connection import parse_url

        seeds = []
        first: dict[str, Any] = {}
        for url in spec.cluster:
            parsed: dict[str, Any] = dict(parse_url(url))
            first = first or parsed
            seeds.append(ClusterNode(parsed.get("host", "127.0.0.1"), int(parsed.get("port", 6379))))
        if timeout is None:
            # SUBSCRIBE on any node hears PUBLISH from every node of a cluster.
            return aioredis.Redis(
                host=seeds[0].host,
                port=int(seeds[0].port),
                password=first.get("password"),
                username=first.get("username"),
                **options,
            )
        return RedisCluster(
            startup_nodes=seeds,
            password=first.get("password"),
            username=first.get("username"),
            max_connections=spec.pool_size,
            require_full_coverage=False,
            **options,
        )
    if spec.sentinel is not None:
        s = spec.sentinel
        sentinel_kwargs: dict[str, Any] = {"socket_timeout": timeout or 2.0, "socket_connect_timeout": timeout or 2.0}
        if s.sentinel_password:
            sentinel_kwargs["password"] = s.sentinel_password
        sentinel = Sentinel(list(s.nodes), sentinel_kwargs=sentinel_kwargs, **options)  # type: ignore[no-untyped-call]
        return sentinel.master_for(s.master, password=s.password, db=s.db, **options)
    assert spec.url is not None
    if timeout is None:
        return aioredis.Redis.from_url(spec.url, **options)
    pool = aioredis.BlockingConnectionPool.from_url(
        spec.url, max_connections=spec.pool_size, timeout=timeout, **options
    )
    return aioredis.Redis(connection_pool=pool)
