"""``listen:``: the addresses to bind (``host:port``, ``"host:port ssl"`` or a mapping), and the
check that every server listening with ``ssl`` has a certificate to serve.

The specs (``ListenSpec``) live in ``servers``, beside the virtual hosts that list them.
"""

from __future__ import annotations

from typing import Any

from gateway.config.reader import Reader, as_bool, host_port
from gateway.config.servers import ListenSpec, VirtualServerSpec
from gateway.config.tls import TlsSpec
from gateway.errors import KeyPath


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
    """``host:port``, ``"host:port ssl"`` (nginx's spelling) or ``{address: host:port, ssl: true}``."""
    tls = False
    if isinstance(item, dict):
        data = r.mapping(item, path, ("address", "ssl"), required=("address",))
        if data is None or "address" not in data:
            return None
        tls = bool(r.field(data, "ssl", path, as_bool, False))
        item, path = data["address"], path + ("address",)
    elif isinstance(item, str) and item.split()[1:] == ["ssl"]:
        item, tls = item.split()[0], True
    try:
        host, port = host_port()(item)
    except ValueError as exc:
        r.error(path, str(exc))
        return None
    return ListenSpec(host, port, tls)


def check_tls(r: Reader, servers: tuple[VirtualServerSpec, ...], blocks: bool) -> None:
    """Every server that listens with ``ssl`` has a certificate to serve."""
    for server in servers:
        tls: TlsSpec | None = server.tls
        if not any(entry.ssl for entry in server.listen) or tls is None:
            continue
        if tls.certificate is None or tls.key is None:
            where: KeyPath = ("servers", server.index, "listen") if blocks else ("listen",)
            r.error(where, "a listen with ssl needs ssl_certificate and ssl_certificate_key (at the top level or here)")
