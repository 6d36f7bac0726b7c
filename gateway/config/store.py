"""``store:``: where zone state lives: in process (no ``store:``), or in Redis (one server, a
cluster or behind sentinels), and what to do when Redis does not answer (``on_error``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gateway.config.reader import Reader, as_str, host_port, int_in, one_of, positive_duration_ms
from gateway.errors import KeyPath

OnError = Literal["local", "allow", "deny"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SentinelSpec:
    master: str
    nodes: tuple[tuple[str, int], ...]
    password: str | None = None
    sentinel_password: str | None = None
    db: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RedisSpec:
    url: str | None = None
    cluster: tuple[str, ...] = ()
    sentinel: SentinelSpec | None = None
    timeout_ms: int = 50
    on_error: OnError = "local"
    prefix: str = ""
    pool_size: int = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreSpec:
    redis: RedisSpec | None = None


def parse_store(r: Reader, value: Any, path: KeyPath) -> StoreSpec:
    data = r.mapping(value, path, ("redis",))
    if data is None or data.get("redis") is None:
        return StoreSpec()
    rpath = path + ("redis",)
    redis = r.mapping(
        data["redis"], rpath, ("url", "cluster", "sentinel", "timeout", "on_error", "prefix", "pool_size")
    )
    if redis is None:
        return StoreSpec()
    topologies = [k for k in ("url", "cluster", "sentinel") if k in redis]
    if len(topologies) != 1:
        r.error(rpath, "set exactly one of url, cluster or sentinel")
    url = r.field(redis, "url", rpath, as_str, None)
    if url is not None and not url.startswith(("redis://", "rediss://", "unix://")):
        r.error(rpath + ("url",), f"unsupported Redis URL {url!r}: use redis://, rediss:// or unix://")
    cluster: tuple[str, ...] = ()
    if "cluster" in redis:
        seeds = r.sequence(redis["cluster"], rpath + ("cluster",), allow_scalar=True)
        for i, seed in enumerate(seeds):
            if not isinstance(seed, str) or not seed.startswith(("redis://", "rediss://")):
                r.error(rpath + ("cluster", i), f"expected a redis:// seed URL, got {seed!r}")
        cluster = tuple(str(s) for s in seeds)
        if not seeds:
            r.error(rpath + ("cluster",), "a cluster needs at least one seed node")
    sentinel = _sentinel(r, redis["sentinel"], rpath + ("sentinel",)) if "sentinel" in redis else None
    timeout = r.field(redis, "timeout", rpath, positive_duration_ms, 50) or 50
    return StoreSpec(
        redis=RedisSpec(
            url=url,
            cluster=cluster,
            sentinel=sentinel,
            timeout_ms=timeout,
            on_error=r.field(redis, "on_error", rpath, one_of("local", "allow", "deny"), "local") or "local",  # type: ignore[arg-type]
            prefix=_prefix(r, redis, rpath),
            pool_size=r.field(redis, "pool_size", rpath, int_in(1, 10_000, "pool_size"), 64) or 64,
        )
    )


def _prefix(r: Reader, data: dict[str, Any], path: KeyPath) -> str:
    value = data.get("prefix", "")
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        r.error(path + ("prefix",), "expected a string")
        return ""
    return value


def _sentinel(r: Reader, value: Any, path: KeyPath) -> SentinelSpec | None:
    data = r.mapping(
        value, path, ("master", "nodes", "password", "sentinel_password", "db"), required=("master", "nodes")
    )
    if data is None or "master" not in data or "nodes" not in data:
        return None
    parse = host_port(default_port=26379)
    nodes: list[tuple[str, int]] = []
    for i, item in enumerate(r.sequence(data["nodes"], path + ("nodes",), allow_scalar=True)):
        try:
            nodes.append(parse(item))
        except ValueError as exc:
            r.error(path + ("nodes", i), str(exc))
    return SentinelSpec(
        master=r.field(data, "master", path, as_str) or "",
        nodes=tuple(nodes),
        password=r.field(data, "password", path, as_str, None),
        sentinel_password=r.field(data, "sentinel_password", path, as_str, None),
        db=r.field(data, "db", path, int_in(0, 10_000, "db"), 0) or 0,
    )
