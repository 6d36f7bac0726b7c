"""Limit state in Redis, shared by every gateway node (and by OpenResty nodes).

``store``: ``RedisStore`` (how a request's limits become script calls; read its docstring first);
``batcher``: many requests in one script call; ``client``: topology and client library;
``breaker``: the circuit breaker; ``leases``: limit_conn slots; ``reply``: request.lua's
arguments and replies; ``inspect``: one key's state, for the admin API.
"""

from gateway.store.redis.breaker import FAILURES_TO_OPEN, PROBE_EVERY_S, Breaker
from gateway.store.redis.client import connect
from gateway.store.redis.store import LEASE_MS, RENEW_EVERY_S, RedisStore

__all__ = ["FAILURES_TO_OPEN", "LEASE_MS", "PROBE_EVERY_S", "RENEW_EVERY_S", "Breaker", "RedisStore", "connect"]
