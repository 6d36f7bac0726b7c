"""What a node serves beside traffic, wired once for a single process or a master: bans, so far."""

from __future__ import annotations

import os

from gateway.bans.local import LocalBans
from gateway.bans.redis import RedisBans
from gateway.bans.table import BanList
from gateway.config.schema import ConfigSpec
from gateway.store.base import Store
from gateway.store.factory import SOCKET_ENV


def open_bans(spec: ConfigSpec, store: Store | None, banlist: BanList, *, follow: bool) -> LocalBans | RedisBans | None:
    """Where this process reads and writes manual bans (None: it only receives them).

    ``follow``: keep ``banlist`` current from Redis (serving processes); the master of
    several Redis-backed workers only needs to write, so it does not follow.
    """
    redis_spec = spec.store.redis
    if redis_spec is not None:
        from gateway.bans.redis import SYNC_TIMEOUT_S
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
