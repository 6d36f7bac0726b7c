"""The edge's settings from the config, the ``Server`` header, and the open-file limit."""

from __future__ import annotations

import resource

from aiohttp import web_response

from gateway import __version__
from gateway.config.schema import ConfigSpec
from gateway.edge.connections import ConnectionCaps
from gateway.edge.protocol import EdgeSettings
from gateway.http.realip import NetworkSet
from gateway.logs import error as errorlog


def edge_settings(spec: ConfigSpec) -> EdgeSettings:
    edge = spec.edge
    return EdgeSettings(
        caps=ConnectionCaps(
            worker_connections=edge.worker_connections,
            max_per_ip=edge.max_connections_per_ip,
            exempt=NetworkSet(spec.real_ip.trusted),
        ),
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


def raise_fd_limit(worker_connections: int) -> int:
    """Raise the soft limit on open files to the hard limit (nginx's worker_rlimit_nofile, done for you)."""
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
    if worker_connections > soft:
        errorlog.log.warning("%d worker_connections exceed open file resource limit: %d", worker_connections, soft)
    return soft
