"""``listen:``: the addresses to bind (``host:port``, ``"host:port ssl proxy_protocol"`` with either
word, or a mapping), and the
check that every server listening with ``ssl`` has a certificate to serve.

The specs (``ListenSpec``) live in ``servers``, beside the virtual hosts that list them.
"""

from __future__ import annotations

from typing import Any

from gateway.config.reader import Reader, as_bool, host_port
from gateway.config.servers import ListenSpec, VirtualServerSpec
from gateway.config.tls import TlsSpec
from gateway.errors import KeyPath

LISTEN_FLAGS = ("ssl", "proxy_protocol")


def parse_listen(r: Reader, data: dict[str, Any]) -> tuple[ListenSpec, ...]:
    if "listen" not in data:
        return (ListenSpec("0.0.0.0", 8080),)
    return parse_listen_list(r, data["listen"], ("listen",))


def parse_listen_list(r: Reader, value: Any, at: KeyPath) -> tuple[ListenSpec, ...]:
    out: list[ListenSpec] = []
    for i, item in enumerate(r.sequence(value, at, allow_scalar=True)):
        path: KeyPath = at + (i,) if isinstance(value, list) else at
        entry = _listen_entry(r, item, path)
        if entry is None:
            continue
        if any(e.address == entry.address for e in out):
            r.error(path, f"duplicate listen {entry.host}:{entry.port}")
        out.append(entry)
    if not out and not r.errors:
        r.error(at, "at least one listen address is required")
    return tuple(out)


def _listen_entry(r: Reader, item: Any, path: KeyPath) -> ListenSpec | None:
    """``host:port``, ``"host:port ssl proxy_protocol"`` (nginx's spelling, either word or both) or
    ``{address: host:port, ssl: true, proxy_protocol: true}``."""
    tls = proxy = False
    if isinstance(item, dict):
        data = r.mapping(item, path, ("address", "ssl", "proxy_protocol"), required=("address",))
        if data is None or "address" not in data:
            return None
        tls = bool(r.field(data, "ssl", path, as_bool, False))
        proxy = bool(r.field(data, "proxy_protocol", path, as_bool, False))
        item, path = data["address"], path + ("address",)
    elif isinstance(item, str) and len(words := item.split()) > 1:
        flags = words[1:]
        unknown = [w for w in flags if w not in LISTEN_FLAGS]
        if unknown or len(set(flags)) != len(flags):
            r.error(path, f"unknown or repeated listen parameter {(unknown or flags)[0]!r} (ssl, proxy_protocol)")
            return None
        item, tls, proxy = words[0], "ssl" in flags, "proxy_protocol" in flags
    try:
        host, port = host_port()(item)
    except ValueError as exc:
        r.error(path, str(exc))
        return None
    return ListenSpec(host, port, tls, proxy)


def check_tls(r: Reader, servers: tuple[VirtualServerSpec, ...], blocks: bool) -> None:
    """Every server that listens with ``ssl`` has a certificate to serve."""
    for server in servers:
        tls: TlsSpec | None = server.tls
        if not any(entry.ssl for entry in server.listen) or tls is None:
            continue
        if tls.certificate is None or tls.key is None:
            where: KeyPath = ("servers", server.index, "listen") if blocks else ("listen",)
            r.error(where, "a listen with ssl needs ssl_certificate and ssl_certificate_key (at the top level or here)")
