"""Gateway configuration text for tests: one builder, ``config``, for every test's YAML.

A test states only what it is about (its zones, routes and the top-level keys it needs);
the listen address, the ``app`` upstream and the admin API are written the same way for all.
``config(...)`` returns a function of the listen port, as ``gateway_factory`` takes it (it
picks the port, and picks another if that one was taken meanwhile); call it with a port
to get the text.

    gw = gateway_factory(config(upstream, zones="  z: {type: req, key: $uri, rate: 1r/s}",
                                routes="  - {location: /, upstream: app, limit_req: [{zone: z}]}"))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

__all__ = ["ROUTE_ALL", "Addressed", "basic_config", "config"]

ROUTE_ALL = "  - {location: /, upstream: app}"  # the default ``routes:`` body: everything to ``app``


class Addressed(Protocol):
    """Anything with a ``host:port`` address: the upstream doubles in tests/support/upstreams.py."""

    @property
    def address(self) -> str: ...


def _servers(upstream: Addressed | str | Sequence[str | Addressed]) -> str:
    items = [upstream] if isinstance(upstream, str) or hasattr(upstream, "address") else list(upstream)  # type: ignore[arg-type]
    return ", ".join(item if isinstance(item, str) else item.address for item in items)


def config(
    upstream: Addressed | str | Sequence[str | Addressed] | None = None,
    *,
    zones: str = "",
    routes: str = ROUTE_ALL,
    route: str = "",
    admin: int | str | None = None,
    token: str | None = None,
    upstream_options: str = "",
    top: str = "",
    extra: str = "",
) -> Callable[[int], str]:
    """The YAML of a gateway listening on 127.0.0.1:<port>.

    * ``upstream``: the servers of the upstream ``app`` (an upstream double, ``host:port``, or
      a list of them); None for a config without upstreams (``return`` routes only);
    * ``zones`` / ``routes``: the bodies of ``zones:`` and ``routes:``, indented two spaces;
      ``route``: instead of ``routes``, the keys of the one route ``/`` to ``app``, block style
      (indented four spaces: ``"    limit_req: [{zone: z}]"``);
    * ``admin``: a port for the admin API (with ``token``), or the admin mapping's YAML as is
      (``"{listen: off}"``); None leaves ``admin:`` out;
    * ``upstream_options``: more keys of ``app``, flow style (``"read_timeout: 5s"``);
    * ``top``: more top-level keys (``shutdown_timeout``, ``log``, ``real_ip``, ``store``, ...),
      one per line; ``extra``: appended at the end as is.
    """

    def build(port: int) -> str:
        lines = [f"listen: 127.0.0.1:{port}"]
        if top.strip():
            lines.append(top.strip("\n"))
        if isinstance(admin, int):
            auth = f", token: {token}" if token is not None else ""
            lines.append(f"admin: {{listen: 127.0.0.1:{admin}{auth}}}")
        elif admin is not None:
            lines.append(f"admin: {admin}")
        if zones.strip():
            lines += ["zones:", zones.strip("\n")]
        if upstream is not None:
            options = f", {upstream_options}" if upstream_options else ""
            lines += ["upstreams:", f"  app: {{servers: [{_servers(upstream)}]{options}}}"]
        if route.strip():
            lines += ["routes:", "  - location: /", "    upstream: app", route.strip("\n")]
        elif routes.strip():
            lines += ["routes:", routes.strip("\n")]
        return "\n" + "\n".join(lines) + "\n" + extra + ("\n" if extra and not extra.endswith("\n") else "")

    return build


def basic_config(port: int, upstream_addrs: list[str], **sections: str) -> str:
    """The plain proxy of the byte-level tests: ``app`` with short timeouts, in block style so
    that a test can append keys to the upstream or the route (``sections`` are appended)."""
    servers = "\n".join(f"      - {a}" for a in upstream_addrs)
    text = f"""
listen: 127.0.0.1:{port}
shutdown_timeout: 5s
upstreams:
  app:
    servers:
{servers}
    connect_timeout: 1s
    read_timeout: 2s
routes:
  - location: /
    upstream: app
"""
    for value in sections.values():
        text += value
    return text
