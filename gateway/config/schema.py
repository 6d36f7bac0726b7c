"""The configuration document: its top-level keys, the section that parses each, and the
whole ``ConfigSpec`` they build.

Each section's specs and parser live in a module of their own (``listen``, ``edge``, ``realip``,
``log``, ``admin``, ``metrics``, ``upstreams``, ``maps`` (``maps:`` and ``geo:``, parsed first:
every template may use their variables), ``zones``, ``limits``, ``routes``, ``servers``,
``tls``, ``access``, ``bans``, ``store``); the process-level scalars (``workers``,
``shutdown_timeout``, ``temp_path``, ``pid``, ``state_dir``) are read here. Every problem is reported with its
file, line and key path; the parser keeps going after an error so that one ``gateway check``
shows them all.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gateway.config.access import AccessSpec, parse_access
from gateway.config.admin import AdminSpec, parse_admin
from gateway.config.bans import BansSpec, parse_bans
from gateway.config.edge import EDGE_KEYS, EdgeSpec, parse_edge
from gateway.config.listen import check_tls, parse_listen, parse_listen_list
from gateway.config.log import LogSpec, parse_log
from gateway.config.maps import GeoSpec, MapSpec, parse_variables
from gateway.config.metrics import MetricsSpec, parse_metrics
from gateway.config.paths import resolve as resolve_pid_path
from gateway.config.paths import resolve_state_dir
from gateway.config.reader import Reader, as_str, duration_ms, int_in
from gateway.config.realip import RealIpSpec, parse_real_ip
from gateway.config.routes import (
    ROUTE_SETTING_KEYS,
    RouteSettings,
    RouteSpec,
    parse_routes,
    parse_rules,
    parse_settings,
)
from gateway.config.servers import ListenSpec, VirtualServerSpec, bound_addresses, parse_servers
from gateway.config.source import Document
from gateway.config.store import StoreSpec, parse_store
from gateway.config.tls import TLS_KEYS, parse_tls
from gateway.config.upstreams import UpstreamSpec, parse_upstreams
from gateway.config.zones import ZoneSpec, ZoneTable, parse_zones
from gateway.errors import ConfigErrors


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigSpec:
    file: str
    listen: tuple[ListenSpec, ...]  # every address bound (with servers: the union of theirs)
    workers: int  # 0 means "auto": one per core
    shutdown_timeout_ms: int
    edge: EdgeSpec
    real_ip: RealIpSpec
    log: LogSpec
    admin: AdminSpec
    metrics: MetricsSpec = field(default=MetricsSpec())
    upstreams: Mapping[str, UpstreamSpec]
    zones: Mapping[str, ZoneSpec]
    defaults: RouteSettings
    routes: tuple[RouteSpec, ...]  # top-level routes (empty with servers:)
    servers: tuple[VirtualServerSpec, ...] = ()  # always at least one once parsed
    access: AccessSpec
    bans: BansSpec
    store: StoreSpec
    temp_path: str | None = None  # request and response bodies that outgrow memory; None = the system's
    pid: str | None = None  # the pid file's absolute path (gateway/runtime/pidfile.py); None: pid off
    state_dir: str = ""  # absolute: where the embedded store keeps its bans (gateway/bans/database.py)
    warnings: tuple[str, ...] = field(default=())
    maps: Mapping[str, MapSpec] = field(default_factory=lambda: MappingProxyType({}))  # maps: (nginx's map)
    geo: Mapping[str, GeoSpec] = field(default_factory=lambda: MappingProxyType({}))  # geo: (nginx's geo)


TOP_KEYS = (
    "listen",
    "workers",
    "shutdown_timeout",
    *EDGE_KEYS,
    "real_ip",
    "log",
    "admin",
    "metrics",
    "upstreams",
    "maps",
    "geo",
    "zones",
    "defaults",
    "rules",
    "routes",
    "servers",
    "access",
    "bans",
    "store",
    "temp_path",
    *TLS_KEYS,
    "pid",
    "state_dir",
)


def parse_config(doc: Document) -> ConfigSpec:
    """Validate a whole document; raise ``ConfigErrors`` listing every problem."""
    r = Reader(doc)
    data = r.mapping(doc.data, (), TOP_KEYS, what="a mapping at the top level")
    if data is None:
        raise ConfigErrors(r.errors)
    if "routes" in data and "servers" in data:
        r.error(("servers",), "use either routes (one server) or servers (virtual hosts), not both", at_key=True)
    elif "routes" not in data and "servers" not in data:
        r.error((), "missing required key 'routes'")

    listen = parse_listen(r, data)
    workers = _workers(r, data)
    shutdown_ms = r.field(data, "shutdown_timeout", (), duration_ms, 30_000)
    upstreams = parse_upstreams(r, data.get("upstreams"), ("upstreams",)) if "upstreams" in data else {}
    variables = parse_variables(r, data) if "maps" in data or "geo" in data else None
    if variables is not None:
        r.defined = variables.defined
    zones = parse_zones(r, data.get("zones"), ("zones",)) if "zones" in data else ZoneTable()
    defaults = (
        parse_settings(r, data["defaults"], ("defaults",), zones, upstreams, allowed=ROUTE_SETTING_KEYS)
        if "defaults" in data
        else RouteSettings()
    )
    routes = parse_routes(r, data["routes"], zones, upstreams, defaults) if "routes" in data else ()
    tls = parse_tls(r, data, ())
    if "servers" in data:
        servers = parse_servers(
            r,
            data["servers"],
            listen,
            lambda value, path: parse_listen_list(r, value, path),
            lambda value, path: parse_routes(r, value, zones, upstreams, defaults, path),
            lambda server, path: parse_tls(r, server, path, tls),
            TLS_KEYS,
            lambda value, path: parse_rules(r, value, path),
        )
        listen = bound_addresses(servers)
        if "rules" in data:
            r.error(("rules",), "with servers:, rules go in each server (as nginx's if goes in a server block)")
    else:
        rules = parse_rules(r, data["rules"], ("rules",)) if "rules" in data else ()
        servers = (
            VirtualServerSpec(index=0, names=(), listen=listen, default=True, routes=routes, tls=tls, rules=rules),
        )
    check_tls(r, servers, "servers" in data)
    admin = parse_admin(r, data.get("admin"), ("admin",)) if "admin" in data else AdminSpec()
    spec = ConfigSpec(
        file=doc.file,
        listen=listen,
        servers=servers,
        workers=workers,
        shutdown_timeout_ms=shutdown_ms or 0,
        edge=parse_edge(r, data),
        real_ip=parse_real_ip(r, data.get("real_ip"), ("real_ip",)) if "real_ip" in data else RealIpSpec(),
        log=parse_log(r, data.get("log"), ("log",)) if "log" in data else LogSpec(),
        admin=admin,
        metrics=parse_metrics(r, data.get("metrics"), ("metrics",), admin, listen)
        if "metrics" in data
        else MetricsSpec(),
        upstreams=MappingProxyType(upstreams),
        zones=MappingProxyType(zones),
        defaults=defaults,
        routes=routes,
        access=parse_access(r, data.get("access"), ("access",)) if "access" in data else AccessSpec(),
        bans=parse_bans(r, data.get("bans"), ("bans",)) if "bans" in data else BansSpec(),
        store=parse_store(r, data.get("store"), ("store",)) if "store" in data else StoreSpec(),
        temp_path=r.field(data, "temp_path", (), _temp_path, None),
        pid=(pid := _pid(r, data, doc.file)),
        state_dir=_state_dir(r, data, pid, doc.file),
        warnings=tuple(str(w) for w in r.warnings),
        maps=MappingProxyType(dict(variables.maps)) if variables is not None else MappingProxyType({}),
        geo=MappingProxyType(dict(variables.geo)) if variables is not None else MappingProxyType({}),
    )
    if r.errors:
        raise ConfigErrors(r.errors)
    return spec


def _pid(r: Reader, data: dict[str, Any], config_file: str) -> str | None:
    """``pid: PATH`` (relative: to the config file's directory), ``pid: off``, or the default."""
    value = data.get("pid")
    if value is False or value == "off":  # YAML reads a bare `off` as false
        return None
    if value is not None and (not isinstance(value, str) or not value.strip()):
        r.error(("pid",), "must be a file path, or off")
        return None
    return resolve_pid_path(value, config_file)


def _state_dir(r: Reader, data: dict[str, Any], pid: str | None, config_file: str) -> str:
    """``state_dir: PATH`` (relative: to the config file's directory), or beside the pid file."""
    value = data.get("state_dir")
    if value is not None and (not isinstance(value, str) or not value.strip() or "\0" in value):
        r.error(("state_dir",), "must be a directory path")
        value = None
    return resolve_state_dir(value, pid, config_file)


def _workers(r: Reader, data: dict[str, Any]) -> int:
    value = data.get("workers", 1)
    if value == "auto":
        return 0
    try:
        return int_in(1, 512, "number of workers")(value)
    except ValueError as exc:
        r.error(("workers",), f'{exc} (or "auto")')
        return 1


def _temp_path(value: Any) -> str:
    path = as_str(value)
    try:
        usable = os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)
    except ValueError:  # a NUL byte
        usable = False
    if not usable:
        raise ValueError(f"temp_path {path!r} is not an existing directory this process can write to")
    return path
