"""What one request carries through the pipeline: its addresses, route and outcome.

Key extractors and the access log read these fields; nothing here does I/O.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from multidict import CIMultiDictProxy

from gateway.http.realip import ClientAddr

if TYPE_CHECKING:
    from aiohttp.web import BaseRequest


@lru_cache(maxsize=1024)
def host_of(authority: str) -> str:
    """nginx's ``$host`` of a Host header or an authority, as ``ngx_http_validate_host`` leaves it:
    without userinfo and port, lower case, and without one trailing dot (``Example.ORG.:8080`` is
    ``example.org``: the same name to DNS, so to ``if ($host = ...)``, keys and server names).
    Two dots in a row never get here: ``gateway.http.validate`` refuses them, as nginx does."""
    host = authority.rsplit("@", 1)[-1]
    if host.startswith("["):
        return host[: host.find("]") + 1].lower()
    host = host.split(":", 1)[0]
    if host.endswith("."):
        host = host[:-1]
    return host.lower()


class RequestContext:
    __slots__ = (
        "algo_status",
        "authority",
        "body_bytes_sent",
        "client",
        "extra",
        "headers",
        "host",
        "limit_conn_status",
        "limit_count_status",
        "limit_req_status",
        "logged",
        "method",
        "on_last_write",
        "peer",
        "proxy",
        "raw_query",
        "raw_target",
        "request_target",
        "rid",
        "route",
        "scheme",
        "server",
        "server_port",
        "started",
        "status",
        "tls",
        "upstream_addr",
        "upstream_host",
        "upstream_status",
        "upstream_time",
        "uri",
        "variables",
        "version",
    )

    def __init__(
        self, request: BaseRequest, started: float, peer: ClientAddr, scheme: str, server_port: int, tls: Any = None
    ) -> None:
        self.tls = tls  # the ssl.SSLObject of a TLS connection: $ssl_protocol, $ssl_cipher
        self.started = started
        self.method: str = request.method
        message = request._message  # the parsed request line, without re-encoding
        self.request_target: str = message.path  # as the client wrote it ($request)
        self.raw_target: str = message.path  # origin-form: what the upstream receives ($request_uri)
        self.version = message.version
        self.headers: CIMultiDictProxy[str] = request.headers
        authority = self.headers.get("Host", "")
        self.upstream_host: str | None = None  # a Host the upstream must get instead of the client's
        if message.path[:1] != "/" and message.path[:8].lower().startswith(("http://", "https://")):
            # RFC 9112 §3.2.2: an absolute-form target's authority replaces Host (nginx: $host).
            scheme_end = message.path.index("://") + 3
            path_at = message.path.find("/", scheme_end)
            query_at = message.path.find("?", scheme_end)
            cut = min(i for i in (path_at, query_at, len(message.path)) if i >= 0)
            authority = message.path[scheme_end:cut]
            rest = message.path[cut:]
            self.raw_target = rest if rest.startswith("/") else "/" + rest
            self.upstream_host = authority
        self.authority = authority  # the Host header, or an absolute-form target's authority
        query_at = self.raw_target.find("?")
        self.raw_query: str = self.raw_target[query_at + 1 :] if query_at >= 0 else ""
        self.uri: str = ""
        self.host: str = host_of(authority)
        self.scheme = scheme
        self.server_port = server_port
        self.peer = peer
        self.client = peer
        self.proxy: Any = None  # the connection's PROXY protocol header (gateway.edge.proxyproto.ProxyHeader)
        self.route: Any = None
        self.server: Any = None  # the virtual server (gateway.plan.compiled.ServerPlan)
        self.status = 0
        self.upstream_addr = ""
        self.upstream_status = ""
        self.upstream_time = ""
        self.limit_req_status = ""
        self.limit_conn_status = ""
        self.limit_count_status = ""
        # $limit_<type>_status of the zone types of limits: (gateway.limits.registry), by type;
        # None until the limits step sets one (a route without such zones never does)
        self.algo_status: dict[str, str] | None = None
        self.body_bytes_sent = -1
        self.logged = False
        self.extra: dict[str, str] | None = None
        self.rid = ""  # $request_id, made on first use (request_id)
        self.variables: dict[int, bytes] | None = None  # maps and geo used more than once (gateway.http.maps)
        # Called once, just before the response's last bytes go to the client (the pipeline
        # gives back limit_conn slots there: the client's next request must find them free).
        self.on_last_write: Callable[[], None] | None = None

    def last_write(self) -> None:
        hook = self.on_last_write
        if hook is not None:
            self.on_last_write = None
            hook()

    @property
    def request_id(self) -> str:
        """nginx's ``$request_id``: 16 random bytes as 32 lowercase hex digits, made the first time
        it is used and the same wherever this request uses it (upstream header, response, log)."""
        rid = self.rid
        if not rid:
            rid = self.rid = os.urandom(16).hex()
        return rid

    @property
    def ssl_protocol(self) -> str:
        return str(self.tls.version() or "") if self.tls is not None else ""

    @property
    def ssl_cipher(self) -> str:
        cipher = self.tls.cipher() if self.tls is not None else None
        return str(cipher[0]) if cipher else ""

    @property
    def https(self) -> str:
        return "on" if self.tls is not None else ""

    @property
    def path_only(self) -> str:
        query_at = self.raw_target.find("?")
        return self.raw_target[:query_at] if query_at >= 0 else self.raw_target
