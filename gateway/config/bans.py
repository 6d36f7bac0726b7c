"""``bans:``: the status a banned client gets, and how often a node reads the shared ban list."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.config.reader import Reader, positive_duration_ms, status_code
from gateway.errors import KeyPath


@dataclass(frozen=True, slots=True, kw_only=True)
class BansSpec:
    status: int = 403
    sync_interval_ms: int = 5_000


def parse_bans(r: Reader, value: Any, path: KeyPath) -> BansSpec:
    data = r.mapping(value, path, ("status", "sync_interval"))
    if data is None:
        return BansSpec()
    return BansSpec(
        status=r.field(data, "status", path, status_code, 403) or 403,
        sync_interval_ms=r.field(data, "sync_interval", path, positive_duration_ms, 5_000) or 5_000,
    )
