"""Connection-level directives: ``events``, ``worker_processes``, client timeouts, header buffers, ``server_tokens``.

Each writes one top-level key of the gateway document (the edge serves every route alike).
"""

from __future__ import annotations

from gateway.nginxconf.parser import Directive
from gateway.nginxconf.result import Result
from gateway.nginxconf.values import duration_ok

EDGE_DURATIONS = ("client_header_timeout", "send_timeout")


def events(result: Result, block: list[Directive]) -> None:
    for d in block:
        if d.name == "worker_connections" and len(d.args) == 1 and d.args[0].isdigit():
            result.doc["worker_connections"] = int(d.args[0])
        else:
            result.skip(d, "events: only worker_connections has a gateway equivalent")


def worker_processes(result: Result, d: Directive) -> None:
    value = d.args[0]
    if value == "auto":
        result.doc["workers"] = "auto"
    elif value.isdigit() and 1 <= int(value) <= 512:
        result.doc["workers"] = int(value)
    else:
        result.skip(d, "workers must be auto or 1..512")


def edge_duration(result: Result, d: Directive) -> None:
    if len(d.args) == 1 and duration_ok(d.args[0]):
        result.doc[d.name] = d.args[0]
    else:
        result.skip(d, "expected one duration")


def keepalive_timeout(result: Result, d: Directive) -> None:
    if d.args and duration_ok(d.args[0]):
        result.doc["keepalive_timeout"] = d.args[0]
        if len(d.args) > 1:
            result.note(f"{d.where}: keepalive_timeout's header timeout ({d.args[1]}) is not sent")
    else:
        result.skip(d, "expected a duration")


def header_buffers(result: Result, d: Directive) -> None:
    result.doc["large_client_header_buffers"] = " ".join(d.args)


def server_tokens(result: Result, d: Directive) -> None:
    if d.args and d.args[0] in ("on", "off"):
        result.doc["server_tokens"] = d.args[0] == "on"
    else:
        result.skip(d, "server_tokens: on or off (build and strings are NGINX Plus)")
