"""Where limit state lives; ``make_store`` is the one place that picks a concrete store.

* no ``store.redis`` and one worker: ``MemoryStore`` in the process;
* no ``store.redis`` and several workers: the master's ``MemoryStore``, reached
  through ``SharedStoreClient`` (``GATEWAY_STORE_SOCKET`` names its socket);
* ``store.redis``: ``RedisStore``, shared by every node of a cluster.
"""

from __future__ import annotations

import os

from gateway.bans import BanList, LocalBans, RedisBans
from gateway.config.schema import ConfigSpec
from gateway.store.base import Store

SOCKET_ENV = "GATEWAY_STORE_SOCKET"


def make_store(spec: ConfigSpec) -> Store:
    if spec.store.redis is not None:
        from gateway.store.redis import RedisStore

        return RedisStore(spec.store.redis)
    socket_path = os.environ.get(SOCKET_ENV)
    if socket_path:
        from gateway.store.shared import SharedStoreClient

        return SharedStoreClient(socket_path)
    from gateway.store.memory import MemoryStore

    return MemoryStore()


def open_bans(spec: ConfigSpec, store: Store | None, banlist: BanList, *, follow: bool) -> LocalBans | RedisBans | None:
    """Where this process reads and writes manual bans (None: it only receives them).

    ``follow``: keep ``banlist`` current from Redis (serving processes); the master of
    several Redis-backed workers only needs to write, so it does not follow.
    """
    redis_spec = spec.store.redis
    if redis_spec is not None:
        from gateway.ban_redis import SYNC_TIMEOUT_S
        from gateway.store.redis import connect

        # Its own connections and deadline: reading a long list must not wait on, nor be cut
        # short by, the request path's timeout.
        return RedisBans(
            connect(redis_spec, SYNC_TIMEOUT_S),
            redis_spec.prefix.encode(),
            banlist,
            sync_interval_s=spec.bans.sync_interval_ms / 1000,
            subscriber=(lambda: connect(redis_spec, None)) if follow else None,
            owns_client=True,
        )
    if os.environ.get(SOCKET_ENV):
        return None  # a worker: the master owns the bans and pushes them here
    return LocalBans(banlist)
