"""Access log formats: the named presets and the variables a template may use."""

from __future__ import annotations

import re

from gateway.limits.registry import status_variables

PRESETS = {
    "combined": '$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent '
    '"$http_referer" "$http_user_agent"',
    "main": '$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent '
    '"$http_referer" "$http_user_agent" "$http_x_forwarded_for"',
    "gateway": '$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent '
    '"$http_referer" "$http_user_agent" rt=$request_time ua="$upstream_addr" us=$upstream_status '
    "ut=$upstream_response_time lreq=$limit_req_status lconn=$limit_conn_status lcount=$limit_count_status",
}
VARIABLES = frozenset(
    {
        "remote_addr", "realip_remote_addr", "proxy_protocol_addr", "proxy_protocol_port", "binary_remote_addr",
        "remote_user", "time_local", "time_iso8601",
        "msec", "request", "request_method", "request_uri", "uri", "args", "host", "server_protocol", "status",
        "body_bytes_sent", "request_time", "upstream_addr", "upstream_status", "upstream_response_time",
        "limit_req_status", "limit_conn_status", "limit_count_status", "route", "server_port", "scheme", "pid",
        *status_variables(), "server_name", "request_id",
        "ssl_protocol", "ssl_cipher", "https",
    }
)  # fmt: skip
VARIABLE = re.compile(r"\$(?:\{([A-Za-z0-9_]+)\}|([A-Za-z0-9_]+))")


def unknown_variables(template: str) -> list[str]:
    names = [m.group(1) or m.group(2) for m in VARIABLE.finditer(template)]
    return [n for n in names if n not in VARIABLES and not (n.startswith("http_") and len(n) > 5)]
