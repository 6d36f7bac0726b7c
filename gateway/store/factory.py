"""Where limit state lives; ``make_store`` is the one place that picks a concrete store.

* no ``store.redis`` and one worker: ``MemoryStore`` in the process;
* no ``store.redis`` and several workers: the master's ``MemoryStore``, reached
  through ``SharedStoreClient`` (``GATEWAY_STORE_SOCKET`` names its socket);
* ``store.redis``: ``RedisStore``, shared by every node of a cluster.
"""

from __future__ import annotations

import os

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
