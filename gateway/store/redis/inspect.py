"""One key's limit state in Redis: what the scripts of ``scripts/lua/`` wrote, read with a
plain client of its own (not the serving store's), for ``GET``/``DELETE /zones/<zone>/<key>``.

Keys are ``<prefix><zone>:<key>`` (``limit_req``, ``gcra``, and every zone outside Redis
Cluster); values as the scripts write them:

* req: JSON ``[excess (milli-requests), last (epoch ms), forbidden (0/1)]``; a ban's end is the TTL;
* count: ``used:window_end``; a sliding count ``window_id:current:previous``;
* conn: sorted sets scored by lease end;
* the types of ``limits:`` (gcra, sliding_log, token, ...): each reads its own encoding
  (``redis_view`` of its record, ``gateway.limits.algo``): by default shown as stored, with the TTL.

On Redis Cluster, count, conn and algorithm keys carry a hash tag chosen by the serving
store; those are not looked up here (the answer is "no state").
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from gateway.clock import epoch_ms
from gateway.config.schema import ConfigSpec
from gateway.config.zones import ZoneSpec
from gateway.limits.registry import algo_types
from gateway.store.inspect import UnknownZone, store_key

TIMEOUT_S = 2.0


class RedisZoneState:
    def __init__(self, config: Callable[[], ConfigSpec]) -> None:
        self.config = config
        self._client: Any = None

    def _spec(self, name: str) -> ZoneSpec:
        spec = self.config().zones.get(name)
        if spec is None:
            raise UnknownZone(name)
        return spec

    def _redis_key(self, zone: str, key: bytes) -> bytes:
        redis_spec = self.config().store.redis
        assert redis_spec is not None
        return redis_spec.prefix.encode() + zone.encode() + b":" + key

    def client(self) -> Any:
        if self._client is None:
            from gateway.store.redis import connect

            redis_spec = self.config().store.redis
            assert redis_spec is not None
            self._client = connect(redis_spec, TIMEOUT_S)
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    async def show(self, zone: str, text: str) -> dict[str, Any] | None:
        spec = self._spec(zone)
        key = self._redis_key(zone, store_key(spec, text))
        state = await asyncio.wait_for(self._read(spec, key), TIMEOUT_S)
        if state is None:
            return None
        return {"zone": zone, "type": spec.type, "key": text, **state}

    async def reset(self, zone: str, text: str) -> bool:
        spec = self._spec(zone)
        key = self._redis_key(zone, store_key(spec, text))
        return bool(await asyncio.wait_for(self.client().delete(key), TIMEOUT_S))

    async def _read(self, spec: ZoneSpec, key: bytes) -> dict[str, Any] | None:
        client = self.client()
        now = epoch_ms()
        if spec.type == "conn":
            active = int(await client.zcount(key, f"({now}", "+inf"))
            return {"active": active} if active else None
        algo = algo_types().get(spec.type)
        if algo is not None:  # a type of limits: reads its own encoding (gateway.limits.algo)
            return await algo.redis_view(client, key, algo.params_of(spec), now)
        raw, ttl = await asyncio.gather(client.get(key), client.pttl(key))
        if raw is None:
            return None
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        ttl_ms = max(0, int(ttl))
        if spec.type == "req":
            excess, last, forbidden = json.loads(text)[:3]
            assert spec.rate is not None
            leaked = max(0.0, float(excess) - spec.rate.rate_m * max(0, now - int(last)) / 1000)
            return {
                "excess": leaked / 1000,
                "last_ago_ms": max(0, now - int(last)),
                "banned_for_ms": ttl_ms if int(forbidden) else 0,
            }
        if spec.type == "count" and spec.window_type == "sliding":
            window_id, current, previous = (int(x) for x in text.split(":"))
            if window_id < now // spec.window_ms - 1:
                return None
            if window_id == now // spec.window_ms - 1:
                current, previous = 0, current
            weight = 1 - (now % spec.window_ms) / spec.window_ms
            remaining = max(0, int(spec.limit - current - previous * weight))
            return {"current": current, "previous": previous, "remaining": remaining}
        used, window_end = (int(x) for x in text.split(":"))  # count
        if window_end <= now:
            return None
        return {"used": used, "remaining": max(0, spec.limit - used), "reset_in_ms": window_end - now}
