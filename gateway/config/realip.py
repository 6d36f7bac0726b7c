"""``real_ip:``: the proxies trusted to name the client (``from``), the header they name it in, and
whether to walk the header's list (``recursive``), as nginx's realip module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.config.reader import Reader, as_bool, as_str, network
from gateway.errors import KeyPath
from gateway.http.realip import Network


@dataclass(frozen=True, slots=True, kw_only=True)
class RealIpSpec:
    trusted: tuple[Network, ...] = ()
    header: str = "X-Real-IP"
    recursive: bool = False


def parse_networks(r: Reader, value: Any, path: KeyPath) -> tuple[Network, ...]:
    out: list[Network] = []
    for i, item in enumerate(r.sequence(value, path, allow_scalar=True)):
        try:
            out.append(network(item))
        except ValueError as exc:
            r.error(path + (i,) if isinstance(value, list) else path, str(exc))
    return tuple(out)


def parse_real_ip(r: Reader, value: Any, path: KeyPath) -> RealIpSpec:
    data = r.mapping(value, path, ("from", "header", "recursive"))
    if data is None:
        return RealIpSpec()
    header = r.field(data, "header", path, as_str, "X-Real-IP") or "X-Real-IP"
    if any(c in header for c in " :\t"):
        r.error(path + ("header",), f"invalid header name {header!r}")
    return RealIpSpec(
        trusted=parse_networks(r, data["from"], path + ("from",)) if "from" in data else (),
        header=header,
        recursive=bool(r.field(data, "recursive", path, as_bool, False)),
    )
