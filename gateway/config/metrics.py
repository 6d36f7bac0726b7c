"""``metrics:``: an optional listener for ``GET /metrics`` only, on an address of its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.config.admin import AdminSpec
from gateway.config.reader import Reader, host_port
from gateway.config.servers import ListenSpec
from gateway.errors import KeyPath


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsSpec:
    listen: tuple[str, int] | None = None  # a listener for GET /metrics only, without a token


def parse_metrics(
    r: Reader, value: Any, path: KeyPath, admin: AdminSpec, listen: tuple[ListenSpec, ...]
) -> MetricsSpec:
    data = r.mapping(value, path, ("listen",))
    if data is None:
        return MetricsSpec()
    if data.get("listen") in (None, False, "off"):
        return MetricsSpec()
    address = r.field(data, "listen", path, host_port())
    if address is None:
        return MetricsSpec()
    bound = {entry.address for entry in listen}
    taken = "admin.listen" if address == admin.listen else "listen" if address in bound else None
    if taken is not None:
        r.error(path + ("listen",), f"{address[0]}:{address[1]} is already used by {taken}")
    return MetricsSpec(listen=address)
