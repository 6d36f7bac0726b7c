"""The edge's settings from the config, the ``Server`` header, and the open-file limit.

The connection budget: how many client connections one worker serves. It is the smaller of
``worker_connections`` and what the open file limit (``RLIMIT_NOFILE``, raised to its hard
limit at start) leaves for them::

    reserve = 64                      the process: stdio, event loop, signal pipes, log files,
                                      admin and metrics listeners, files a reload reads, and the
                                      odd temp file of a body that outgrew memory
            + listen entries          one listening socket each
            + sum of upstream ``keepalive``   idle upstream connections kept between requests
            + Redis ``pool_size``     when the store is Redis
    budget  = min(worker_connections, (open file limit - reserve) // 2)

A proxied request costs two descriptors: the client's connection and the upstream's (or, while
a buffered body is read, the client's and its temp file). nginx counts both against
``worker_connections``; the gateway's ``worker_connections`` counts client connections only, so
the division by two is what keeps ``accept`` from ever failing with "Too many open files"
(which would stop *all* accepting, where the budget only reclaims idle and stalled
connections). Each serving process computes its own: descriptors are per process.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

from aiohttp import web_response

from gateway import __version__
from gateway.config.schema import ConfigSpec
from gateway.edge.connections import ConnectionCaps
from gateway.edge.protocol import EdgeSettings
from gateway.http.realip import NetworkSet
from gateway.logs import error as errorlog

PROCESS_RESERVE = 64  # descriptors kept for the process itself (see the module docstring)
DESCRIPTORS_PER_CONNECTION = 2  # a client connection, and its upstream connection or temp file
MIN_BUDGET = 16  # worker_connections' own minimum: below it the gateway serves this many anyway


@dataclass(frozen=True, slots=True)
class Budget:
    """How many client connections a worker serves, and why (the start-up log's line)."""

    connections: int
    fd_bound: bool  # the open file limit, not worker_connections, sets it
    message: str


def connection_budget(spec: ConfigSpec, fd_limit: int | None = None) -> Budget:
    """The budget for ``spec`` under ``fd_limit`` (None: this process's soft RLIMIT_NOFILE)."""
    if fd_limit is None:
        fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    wanted = spec.edge.worker_connections
    keepalive = sum(u.keepalive for u in spec.upstreams.values())
    redis = spec.store.redis.pool_size if spec.store.redis is not None else 0
    listeners = len(spec.listen)
    reserve = PROCESS_RESERVE + listeners + keepalive + redis
    if fd_limit == resource.RLIM_INFINITY or fd_limit < 0:
        allowed = wanted
    else:
        allowed = max((fd_limit - reserve) // DESCRIPTORS_PER_CONNECTION, MIN_BUDGET)
    parts = [f"{PROCESS_RESERVE} for the process, logs and temp files"]
    if keepalive:
        parts.append(f"{keepalive} for idle upstream keep-alive connections")
    if redis:
        parts.append(f"{redis} for the Redis pool")
    parts.append(f"{listeners} for listening sockets")
    why = (
        f"reserve {reserve}: {', '.join(parts)}; "
        f"{DESCRIPTORS_PER_CONNECTION} descriptors per proxied connection: the client's and the upstream's"
    )
    if allowed < wanted:
        message = (
            f"worker_connections {wanted} need more descriptors than the open file limit {fd_limit} allows: "
            f"serving at most {allowed} client connections ({why})"
        )
        return Budget(allowed, True, message)
    limit_text = "unlimited" if fd_limit == resource.RLIM_INFINITY or fd_limit < 0 else str(fd_limit)
    message = (
        f"serving at most {wanted} client connections (worker_connections; "
        f"the open file limit {limit_text} would allow {allowed}, {why})"
    )
    return Budget(wanted, False, message)


def edge_settings(spec: ConfigSpec, fd_limit: int | None = None) -> EdgeSettings:
    edge = spec.edge
    budget = connection_budget(spec, fd_limit)
    return EdgeSettings(
        caps=ConnectionCaps(
            worker_connections=budget.connections,
            max_per_ip=edge.max_connections_per_ip,
            exempt=NetworkSet(spec.real_ip.trusted),
            limit_name="worker_connections" if not budget.fd_bound else "connections (the open file limit's budget)",
            min_body_rate=edge.client_body_min_rate,
        ),
        budget=budget,
        client_header_timeout_s=edge.client_header_timeout_ms / 1000,
        keepalive_timeout_s=edge.keepalive_timeout_ms / 1000,
        send_timeout_s=edge.send_timeout_ms / 1000,
        header_buffer_size=edge.header_buffer_size,
        header_buffers=edge.header_buffers,
    )


def set_server_tokens(on: bool) -> None:
    """The ``Server`` header of every response the gateway makes itself.

    aiohttp fills in ``Server: Python/3.x aiohttp/3.x`` wherever a response has none;
    it reads that default from a module global at each response, so setting it here
    covers every response of this process (errors, rejections, redirects, the admin
    API, and proxied responses whose upstream sent no ``Server``). A proxied response
    keeps its upstream's ``Server``.
    """
    web_response.SERVER_SOFTWARE = f"gateway/{__version__}" if on else "gateway"  # type: ignore[attr-defined]


def raise_fd_limit() -> int:
    """Raise the soft limit on open files to the hard limit (nginx's worker_rlimit_nofile, done for
    you); each serving process then fits its connection budget to it (``connection_budget``)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:
            with open("/proc/sys/fs/nr_open") as fh:
                target = int(fh.read())
        except (OSError, ValueError):
            target = max(soft, 1 << 20)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            errorlog.log.warning("could not raise the open file limit from %d to %d: %s", soft, target, exc)
    return soft
