"""Argument checks and small conversions for single nginx directives (no state).

Each check mirrors what ``gateway check`` will demand, so a value that would fail
there is skipped with a reason instead of breaking the output.
"""

from __future__ import annotations

from typing import Any

from gateway.config.units import parse_duration_ms, parse_rate, parse_size
from gateway.config.zones import parse_zone_key
from gateway.http.keys import NO_DEFINED, Defined, parse_key
from gateway.nginxconf.parser import Directive

Doc = dict[str, Any]

# route-level settings: nginx name -> gateway key (values pass through after a check)
ROUTE_DURATIONS = {"client_body_timeout": "client_body_timeout"}
ROUTE_SIZES = {
    "client_max_body_size": "client_max_body_size",
    "client_body_buffer_size": "client_body_buffer_size",
    "proxy_max_temp_file_size": "proxy_max_temp_file_size",
}
ROUTE_ON_OFF = {"proxy_request_buffering": "proxy_request_buffering", "proxy_buffering": "proxy_buffering"}
LIMIT_STATUS = ("limit_req_status", "limit_conn_status")
LIMIT_LOG_LEVEL = ("limit_req_log_level", "limit_conn_log_level")
DRY_RUN = ("limit_req_dry_run", "limit_conn_dry_run")
UPSTREAM_TIMEOUTS = {
    "proxy_connect_timeout": "connect_timeout",
    "proxy_read_timeout": "read_timeout",
    "proxy_send_timeout": "send_timeout",
}
AUTH = ("auth_basic", "auth_request")  # guards the gateway has no equivalent of: inherited, checked per route
INHERITED = (
    *AUTH,
    *ROUTE_DURATIONS,
    *ROUTE_SIZES,
    *ROUTE_ON_OFF,
    *LIMIT_STATUS,
    *LIMIT_LOG_LEVEL,
    *DRY_RUN,
    *UPSTREAM_TIMEOUTS,
    "proxy_buffers",
    "proxy_next_upstream_tries",
    "limit_req",
    "limit_conn",
    "proxy_set_header",
    "add_header",
)
LOG_LEVELS = ("info", "notice", "warn", "error")
REDIRECT_CODES = (301, 302, 303, 307, 308)


# directive -> the arguments with which it does what the gateway does anyway (None: any arguments)
SAME_AS_NGINX: dict[str, tuple[tuple[str, ...], ...] | None] = {
    "proxy_http_version": (("1.1",),),  # the gateway speaks HTTP/1.1 to upstreams
    "proxy_redirect": (("off",),),  # the gateway does not rewrite Location
    "tcp_nodelay": None,  # file serving and socket tuning: nothing here
    "tcp_nopush": None,
    "sendfile": None,
    "aio": None,
    "directio": None,
    "open_file_cache": None,
    "open_file_cache_valid": None,
    "open_file_cache_min_uses": None,
    "open_file_cache_errors": None,
    "autoindex": (("off",),),
    "break": ((),),  # ends the rewrite directives; with no rewrite it does nothing
    "proxy_pass_request_headers": (("on",),),
    "proxy_pass_request_body": (("on",),),
    "proxy_ignore_client_abort": (("off",),),
    "chunked_transfer_encoding": (("on",),),
    "types_hash_max_size": None,  # hash sizes of nginx's own tables
    "types_hash_bucket_size": None,
    "server_names_hash_bucket_size": None,
    "server_names_hash_max_size": None,
    "variables_hash_max_size": None,
    "variables_hash_bucket_size": None,
    "map_hash_bucket_size": None,
    "map_hash_max_size": None,
    "proxy_headers_hash_max_size": None,
    "proxy_headers_hash_bucket_size": None,
}
# proxy_set_header values for the WebSocket handshake and upstream keep-alive, which the gateway does itself
SAME_HEADERS = {
    "upgrade": ("$http_upgrade", "websocket"),
    "connection": ("$connection_upgrade", "upgrade", "Upgrade", "", "keep-alive"),
}


def same_as_nginx(d: Directive) -> bool:
    """``d`` needs no key: the gateway behaves so already, or it only concerns nginx's own files and tables."""
    if d.block is not None:
        return False
    if d.name == "proxy_set_header" and len(d.args) == 2:
        return d.args[1] in SAME_HEADERS.get(d.args[0].lower(), ())
    if d.name not in SAME_AS_NGINX:
        return False
    forms = SAME_AS_NGINX[d.name]
    return forms is None or tuple(d.args) in forms


# -- checks and conversions ----------------------------------------------------------------------------------


def unsupported(d: Directive) -> str:
    if d.name in ("map", "geo") and d.block is not None:
        return f'nginx: "{d.name}" is allowed at http level only'
    if d.name in ("split_clients", "if", "limit_except", "types"):
        return f'"{d.name}" blocks are not supported'
    if d.name.startswith("ssl_"):
        return "no gateway equivalent (TLS: ssl_certificate, ssl_certificate_key, ssl_protocols, ssl_ciphers)"
    if d.name.startswith(("http2", "quic", "http3")):
        return "HTTP/2 and HTTP/3 are not supported: terminate them in front of the gateway"
    if d.name.startswith(("fastcgi_", "uwsgi_", "scgi_", "grpc_", "memcached_")):
        return "only HTTP proxying is supported"
    if d.name in ("rewrite", "try_files", "root", "alias", "index", "autoindex", "gzip", "sendfile"):
        return "not supported: the gateway proxies and limits, it serves no files and rewrites no URIs"
    return "no gateway equivalent"


def key_values(args: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for a in args:
        key, _, value = a.partition("=")
        out[key] = value
    return out


def duration_ok(text: str) -> bool:
    try:
        parse_duration_ms(text)
    except ValueError:
        return False
    return True


def size_ok(text: str) -> bool:
    try:
        parse_size(text)
    except ValueError:
        return False
    return True


def zone_problem(d: Directive, name: str, zone_size: str, defined: Defined = NO_DEFINED) -> str:
    if not d.args or not name or not zone_size:
        return "expected KEY zone=NAME:SIZE"
    if not size_ok(zone_size) or parse_size(zone_size) < 32 * 1024:
        return f'zone "{name}" is too small or its size is invalid (at least 32k)'
    try:
        parse_key(d.args[0], defined)
    except ValueError as exc:
        return f"key {d.args[0]}: {exc} (the gateway knows fewer variables than nginx)"
    try:
        parse_zone_key(d.args[0], defined)
    except ValueError as exc:
        return f"key {d.args[0]}: {exc}"
    return ""


def rate_problem(rate: str | None) -> str:
    if rate is None:
        return "missing rate="
    try:
        parse_rate(rate)
    except ValueError as exc:
        return str(exc)
    return ""


def check_setting(d: Directive) -> str:
    """An inherited directive's arguments, checked so that the output passes ``gateway check``."""
    a = d.args
    name = d.name
    if name in AUTH:
        return "" if len(a) == 1 else f"{name}: expected one value"
    if name == "limit_req":
        ok = any(x.startswith("zone=") for x in a) and all(_limit_req_word(x) for x in a)
        return "" if ok else "expected zone=NAME [burst=N] [nodelay | delay=N]"
    if name == "limit_conn":
        return "" if len(a) == 2 and a[1].isdigit() and 1 <= int(a[1]) <= 65535 else "expected ZONE 1..65535"
    if name == "proxy_set_header":
        return "" if len(a) == 2 else "expected a header name and a value"
    if name == "add_header":
        return "" if len(a) == 2 or (len(a) == 3 and a[2] == "always") else "expected NAME VALUE [always]"
    if len(a) != 1 and name != "proxy_buffers":
        return f"{name}: expected one value"
    if name in LIMIT_STATUS:
        return "" if a[0].isdigit() and 400 <= int(a[0]) <= 599 else "a status between 400 and 599"
    if name in LIMIT_LOG_LEVEL:
        return "" if a[0] in LOG_LEVELS else "info, notice, warn or error"
    if name in (*DRY_RUN, *ROUTE_ON_OFF):
        return "" if a[0] in ("on", "off") else "on or off"
    if name in (*ROUTE_DURATIONS, *UPSTREAM_TIMEOUTS):
        return "" if duration_ok(a[0]) else "invalid duration"
    if name in ROUTE_SIZES:
        return "" if size_ok(a[0]) else "invalid size"
    if name == "proxy_next_upstream_tries":
        return "" if a[0].isdigit() and int(a[0]) <= 1000 else "0..1000"
    if name == "proxy_buffers":
        return "" if len(a) == 2 and a[0].isdigit() and size_ok(a[1]) else "expected NUMBER SIZE"
    return ""


def _limit_req_word(word: str) -> bool:
    key, _, value = word.partition("=")
    if key == "zone":
        return bool(value)
    if key in ("burst", "delay"):
        return value.isdigit() and int(value) <= 2**31 - 1
    return word == "nodelay"


def limit_req_entry(d: Directive) -> Doc:
    params = key_values(d.args)
    entry: Doc = {"zone": params["zone"]}
    if int(params.get("burst", "0") or 0):
        entry["burst"] = int(params["burst"])
    if "nodelay" in params:
        entry["nodelay"] = True
    elif int(params.get("delay", "0") or 0):
        entry["delay"] = int(params["delay"])
    return entry


def location_text(args: list[str]) -> tuple[str, str] | None:
    if len(args) == 2 and args[0] in ("=", "~", "~*", "^~"):
        return args[0], args[1]
    if len(args) == 1:
        word = args[0]
        if word.startswith("@"):
            return None
        for modifier in ("~*", "^~", "=", "~"):  # nginx accepts "=/x" and "~*\.php$" without a space
            if word.startswith(modifier) and len(word) > len(modifier):
                return modifier, word[len(modifier) :]
        return "", word
    return None


def return_value(d: Directive) -> Doc | None:
    a = d.args
    if len(a) == 1 and not a[0].isdigit():
        return {"code": 302, "url": a[0]}
    if not a or not a[0].isdigit() or not 200 <= int(a[0]) <= 599 or len(a) > 2:
        return None
    code = int(a[0])
    if len(a) == 1:
        return {"code": code}
    return {"code": code, "url": a[1]} if code in REDIRECT_CODES else {"code": code, "text": a[1]}


def add_header_entry(d: Directive) -> Doc:
    entry: Doc = {"name": d.args[0], "value": d.args[1]}
    if len(d.args) == 3:
        entry["always"] = True
    return entry


def log_target(path: str) -> str:
    return {"/dev/stdout": "stdout", "/dev/stderr": "stderr"}.get(path, path)
