"""``admin:``: the admin API's address and its token (inline, from the environment, or a file)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from gateway.config.reader import Reader, as_str, host_port
from gateway.config.validate import is_loopback_host, valid_token
from gateway.errors import KeyPath


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminSpec:
    listen: tuple[str, int] | None = ("127.0.0.1", 9180)
    token: str | None = None
    token_file: str | None = None  # None: gateway.admin.token.default_token_path(port)


def parse_admin(r: Reader, value: Any, path: KeyPath) -> AdminSpec:
    data = r.mapping(value, path, ("listen", "token", "token_file"))
    if data is None:
        return AdminSpec()
    listen: tuple[str, int] | None = ("127.0.0.1", 9180)
    if data.get("listen") in (False, "off"):
        listen = None
    elif "listen" in data:
        listen = r.field(data, "listen", path, host_port())
    token = r.field(data, "token", path, as_str, None)
    if token is not None and token.startswith("$"):
        token = os.environ.get(token[1:]) or None
        if token is None:
            r.error(path + ("token",), f"environment variable {data['token'][1:]} is not set")
    if token is not None and not valid_token(token):
        r.error(path + ("token",), "the token must be visible ASCII characters, without spaces")
    token_file = r.field(data, "token_file", path, as_str, None)
    if token_file is not None and not os.path.isabs(token_file):
        r.error(path + ("token_file",), "must be an absolute path (the CLI reads it from another directory)")
    if listen is not None and "token" not in data and not is_loopback_host(listen[0]):
        host = f"[{listen[0]}]" if ":" in listen[0] else listen[0]
        r.error(
            path + ("listen",),
            f"{host}:{listen[1]} is not a loopback address: an admin API reachable from other machines "
            "needs admin.token",
        )
    return AdminSpec(listen=listen, token=token, token_file=token_file)
