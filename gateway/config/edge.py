"""The top-level client-connection settings (nginx's names and defaults): ``worker_connections``,
``client_header_timeout``, ``keepalive_timeout``, ``send_timeout``, ``max_connections_per_ip``,
``large_client_header_buffers``, ``server_tokens`` and ``underscores_in_headers``; and one nginx does not have:

``client_body_min_rate`` (a size per second, default ``1k``; ``0``: off): the slowest a request
body may arrive once the worker has no room left for new connections. nginx's
``client_body_timeout`` bounds the wait between two reads, so a client sending a byte a minute
keeps its connection for ever; as Envoy, HAProxy, Apache (``mod_reqtimeout``'s ``MinRate``) and
Kestrel do, the gateway adds a floor rate. When a new connection finds the worker's connection
budget full (``worker_connections``, or what the open file limit allows), the connections that
make no progress are closed to make room, oldest first: idle keep-alive ones, ones still sending
their header or their TLS handshake, and ones whose body, counted from the end of its header,
averages less than this rate after a first second of grace. Bodies that arrive faster, and
requests waiting on their upstream, are never taken.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.config.reader import Reader, as_bool, duration_ms, int_in, positive_duration_ms, size


@dataclass(frozen=True, slots=True, kw_only=True)
class EdgeSpec:
    """How the gateway treats client connections (nginx's names and defaults)."""

    worker_connections: int = 10240
    client_header_timeout_ms: int = 60_000
    keepalive_timeout_ms: int = 75_000  # 0: no keep-alive
    send_timeout_ms: int = 60_000
    max_connections_per_ip: int = 256  # 0: no cap (beyond nginx)
    header_buffers: int = 4  # large_client_header_buffers 4 8k
    header_buffer_size: int = 8192
    server_tokens: bool = False
    underscores_in_headers: bool = False  # nginx's default: a name with "_" is not passed on
    client_body_min_rate: int = 1024  # bytes per second; 0: off


EDGE_KEYS = (
    "worker_connections",
    "client_header_timeout",
    "keepalive_timeout",
    "send_timeout",
    "max_connections_per_ip",
    "large_client_header_buffers",
    "server_tokens",
    "underscores_in_headers",
    "client_body_min_rate",
)


def parse_edge(r: Reader, data: dict[str, Any]) -> EdgeSpec:
    d = EdgeSpec()
    buffers, buffer_size = d.header_buffers, d.header_buffer_size
    if "large_client_header_buffers" in data:
        parsed = r.field(data, "large_client_header_buffers", (), _header_buffers)
        if parsed is not None:
            buffers, buffer_size = parsed
    return EdgeSpec(
        worker_connections=r.field(
            data, "worker_connections", (), int_in(16, 1_000_000, "worker_connections"), d.worker_connections
        )
        or d.worker_connections,
        client_header_timeout_ms=r.field(
            data, "client_header_timeout", (), positive_duration_ms, d.client_header_timeout_ms
        )
        or d.client_header_timeout_ms,
        keepalive_timeout_ms=r.field(data, "keepalive_timeout", (), duration_ms, d.keepalive_timeout_ms) or 0,
        send_timeout_ms=r.field(data, "send_timeout", (), positive_duration_ms, d.send_timeout_ms) or d.send_timeout_ms,
        max_connections_per_ip=r.field(
            data, "max_connections_per_ip", (), int_in(0, 1_000_000, "max_connections_per_ip"), 256
        )
        or 0,
        header_buffers=buffers,
        header_buffer_size=buffer_size,
        server_tokens=bool(r.field(data, "server_tokens", (), as_bool, False)),
        underscores_in_headers=bool(r.field(data, "underscores_in_headers", (), as_bool, False)),
        client_body_min_rate=_or_default(r.field(data, "client_body_min_rate", (), size, None), d.client_body_min_rate),
    )


def _or_default(value: int | None, default: int) -> int:
    return default if value is None else value


def _header_buffers(value: Any) -> tuple[int, int]:
    """nginx's ``large_client_header_buffers number size``, e.g. ``4 8k``."""
    parts = str(value).split() if isinstance(value, str) else []
    if len(parts) != 2 or not parts[0].isdigit():
        raise ValueError(f'expected "<number> <size>" such as "4 8k", got {value!r}')
    number = int(parts[0])
    buffer_size = size(parts[1])
    if not 1 <= number <= 64:
        raise ValueError(f"invalid number of buffers {number}: must be between 1 and 64")
    if not 1024 <= buffer_size <= 1024 * 1024:
        raise ValueError(f"invalid buffer size {parts[1]}: must be between 1k and 1m")
    return number, buffer_size
