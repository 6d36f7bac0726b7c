"""Command-line overrides applied on top of the file (and again on every reload)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType

from gateway.config.reader import host_port
from gateway.config.schema import ConfigSpec
from gateway.config.servers import ListenSpec
from gateway.config.upstreams import ServerSpec, UpstreamSpec, server_address
from gateway.errors import ConfigError, ConfigErrors


@dataclass(frozen=True, slots=True)
class Overrides:
    listen: tuple[ListenSpec, ...] = ()
    upstreams: tuple[tuple[str, tuple[tuple[str, int, str | None], ...]], ...] = ()  # (host, port, unix path)
    workers: int | None = None

    @staticmethod
    def parse(listen: list[str], upstreams: list[str], workers: str | None) -> Overrides:
        errors: list[ConfigError] = []
        parsed_listen = []
        for item in listen:
            try:
                address, *flags = item.split()
                if any(f not in ("ssl", "proxy_protocol") for f in flags) or len(set(flags)) != len(flags):
                    raise ValueError(f"expected host:port or 'host:port [ssl] [proxy_protocol]', got {item!r}")
                parsed_listen.append(
                    ListenSpec(*host_port()(address), ssl="ssl" in flags, proxy_protocol="proxy_protocol" in flags)
                )
            except ValueError as exc:
                errors.append(ConfigError(str(exc), file="--listen"))
        parsed_up = []
        for item in upstreams:
            name, sep, servers = item.partition("=")
            if not sep or not name or not servers:
                errors.append(ConfigError(f"expected NAME=host:port[,host:port], got {item!r}", file="--upstream"))
                continue
            addrs = []
            for server in servers.split(","):
                try:
                    addrs.append(server_address(server.strip()))
                except ValueError as exc:
                    errors.append(ConfigError(str(exc), file="--upstream"))
            parsed_up.append((name, tuple(addrs)))
        worker_count = None
        if workers is not None:
            if workers == "auto":
                worker_count = 0
            elif workers.isdigit() and 0 < int(workers) <= 512:
                worker_count = int(workers)
            else:
                errors.append(ConfigError(f"expected a number of workers or auto, got {workers!r}", file="--workers"))
        if errors:
            raise ConfigErrors(errors)
        return Overrides(listen=tuple(parsed_listen), upstreams=tuple(parsed_up), workers=worker_count)

    def apply(self, spec: ConfigSpec) -> ConfigSpec:
        changes: dict[str, object] = {}
        if self.listen:  # every server moves to the given addresses
            changes["listen"] = self.listen
            changes["servers"] = tuple(dataclasses.replace(s, listen=self.listen) for s in spec.servers)
        if self.workers is not None:
            changes["workers"] = self.workers
        if self.upstreams:
            upstreams = dict(spec.upstreams)
            for name, addrs in self.upstreams:
                servers = tuple(ServerSpec(host=h, port=p, path=path) for h, p, path in addrs)
                current = upstreams.get(name)
                upstreams[name] = (
                    dataclasses.replace(current, servers=servers)
                    if current is not None
                    else UpstreamSpec(name=name, servers=servers)
                )
            changes["upstreams"] = MappingProxyType(upstreams)
        return dataclasses.replace(spec, **changes) if changes else spec  # type: ignore[arg-type]
