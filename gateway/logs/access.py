"""Access log lines in nginx's formats, written through a small buffer.

Formats: ``combined`` (nginx's default), ``main`` (the ``log_format main`` of
nginx's stock nginx.conf), ``gateway`` (combined plus request time, upstream and
limit statuses), ``json`` (one object per line, every field), or a template
with nginx ``$variables``. Empty values print as ``-``; quotes, backslashes and
control bytes are escaped as ``\\xHH`` as nginx does.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

from aiohttp.abc import AbstractAccessLogger

from gateway.limits.registry import algo_types, status_variables
from gateway.logs import error as errorlog
from gateway.logs.escape import NEEDS_ESCAPE, escape, escape_word
from gateway.logs.formats import PRESETS, VARIABLE
from gateway.metrics.stats import STATS

if TYPE_CHECKING:
    from gateway.http.context import RequestContext

if TYPE_CHECKING:
    from aiohttp.web import BaseRequest, StreamResponse

JSON_FIELDS = (
    "time_iso8601",
    "remote_addr",
    "realip_remote_addr",
    "remote_user",
    "request_method",
    "request_uri",
    "server_protocol",
    "host",
    "status",
    "body_bytes_sent",
    "request_time",
    "http_referer",
    "http_user_agent",
    "http_x_forwarded_for",
    "upstream_addr",
    "upstream_status",
    "upstream_response_time",
    "limit_req_status",
    "limit_conn_status",
    "limit_count_status",
    *status_variables(),  # limit_gcra_status, limit_sliding_log_status, limit_token_status...
    "route",
)


class _Clock:
    """$time_local and $time_iso8601, formatted once per second."""

    def __init__(self) -> None:
        self._second = -1
        self._local = ""
        self._iso = ""

    def refresh(self, now: float) -> None:
        second = int(now)
        if second != self._second:
            self._second = second
            tm = time.localtime(second)
            self._local = time.strftime("%d/%b/%Y:%H:%M:%S %z", tm)
            offset = time.strftime("%z", tm)
            self._iso = time.strftime("%Y-%m-%dT%H:%M:%S", tm) + offset[:3] + ":" + offset[3:]


class Fields:
    """Values of log variables for one request (computed lazily, by name)."""

    def __init__(
        self,
        ctx: RequestContext | None,
        request: BaseRequest,
        response: StreamResponse | None,
        elapsed: float,
        clock: _Clock,
    ) -> None:
        self.ctx = ctx
        self.request = request
        self.response = response
        self.elapsed = elapsed
        self.clock = clock

    def get(self, name: str) -> str:
        return getter(name)(self)


def _remote_user(f: Fields) -> str:
    auth = f.request.headers.get("Authorization", "") or ""
    if auth[:6].lower() != "basic ":
        return ""
    try:
        user = base64.b64decode(auth[6:].strip(), validate=True).split(b":", 1)[0]
    except ValueError:
        return ""
    return user.decode("utf-8", "surrogateescape")  # bytes as sent: escape() writes them back as \xHH


def _status(f: Fields) -> str:
    if f.ctx is not None and f.ctx.status:
        return str(f.ctx.status)
    return str(f.response.status) if f.response is not None else "0"


def _body_bytes(f: Fields) -> str:
    if f.ctx is not None and f.ctx.body_bytes_sent >= 0:
        return str(f.ctx.body_bytes_sent)
    response = f.response
    if response is None:
        return "0"
    if response.content_length is not None:
        return str(response.content_length)
    body = getattr(response, "body", None)
    if isinstance(body, (bytes, bytearray)):
        return str(len(body))
    return str(response.body_length)


def _request_line(f: Fields) -> str:
    version = f.request.version
    target = f.ctx.request_target if f.ctx is not None else f.request.raw_path
    return f"{f.request.method} {target} HTTP/{version.major}.{version.minor}"


def _ctx(attr: str) -> Callable[[Fields], str]:
    return lambda f: str(getattr(f.ctx, attr)) if f.ctx is not None else ""


def _algo_status(kind: str) -> Callable[[Fields], str]:
    """$limit_<kind>_status of a zone type of limits: ("" when no zone of that type answered)."""
    return lambda f: f.ctx.algo_status.get(kind, "") if f.ctx is not None and f.ctx.algo_status else ""


_GETTERS: dict[str, Callable[[Fields], str]] = {
    "remote_addr": lambda f: f.ctx.client.text if f.ctx is not None else (f.request.remote or ""),
    "realip_remote_addr": lambda f: f.ctx.peer.text if f.ctx is not None else (f.request.remote or ""),
    "proxy_protocol_addr": lambda f: f.ctx.proxy.addr_text if f.ctx is not None and f.ctx.proxy is not None else "",
    "proxy_protocol_port": lambda f: f.ctx.proxy.port_text if f.ctx is not None and f.ctx.proxy is not None else "",
    "binary_remote_addr": lambda f: "",
    "remote_user": _remote_user,
    "time_local": lambda f: f.clock._local,
    "time_iso8601": lambda f: f.clock._iso,
    "msec": lambda f: f"{time.time():.3f}",
    "request": _request_line,
    "request_method": lambda f: f.request.method,
    "request_uri": lambda f: f.ctx.raw_target if f.ctx is not None else f.request.raw_path,
    "uri": _ctx("uri"),
    "args": _ctx("raw_query"),
    "host": lambda f: f.ctx.host if f.ctx is not None else f.request.headers.get("Host", ""),
    "server_protocol": lambda f: f"HTTP/{f.request.version.major}.{f.request.version.minor}",
    "status": _status,
    "body_bytes_sent": _body_bytes,
    "request_time": lambda f: f"{f.elapsed:.3f}",
    "upstream_addr": _ctx("upstream_addr"),
    "upstream_status": _ctx("upstream_status"),
    "upstream_response_time": _ctx("upstream_time"),
    "limit_req_status": _ctx("limit_req_status"),
    "limit_conn_status": _ctx("limit_conn_status"),
    "limit_count_status": _ctx("limit_count_status"),
    **{f"limit_{kind}_status": _algo_status(kind) for kind in algo_types()},
    "route": lambda f: str(f.ctx.route.location) if f.ctx is not None and f.ctx.route is not None else "",
    "server_port": _ctx("server_port"),
    "server_name": lambda f: f.ctx.server.name if f.ctx is not None and f.ctx.server is not None else "",
    "scheme": _ctx("scheme"),
    "request_id": lambda f: f.ctx.request_id if f.ctx is not None else os.urandom(16).hex(),
    "ssl_protocol": _ctx("ssl_protocol"),
    "ssl_cipher": _ctx("ssl_cipher"),
    "https": _ctx("https"),
    "pid": lambda f: str(os.getpid()),
}
_VAR = VARIABLE


# Values the presets print unquoted: a space in them is escaped too (escape_word).
_UNQUOTED = frozenset({"remote_user"})
# Values that cannot contain a quote, a backslash or a control byte: printed as they are.
_SAFE = frozenset(
    {"remote_addr", "realip_remote_addr", "time_local", "time_iso8601", "msec", "status", "body_bytes_sent",
     "request_time", "upstream_status", "upstream_response_time", "limit_req_status", "limit_conn_status",
     "limit_count_status", *status_variables(), "server_port", "scheme", "pid", "request_method",
     "server_protocol", "ssl_protocol", "ssl_cipher", "https", "request_id"}
)  # fmt: skip


def _header_getter(name: str) -> Callable[[Fields], str]:
    header = name[5:].replace("_", "-")

    def get(f: Fields) -> str:
        getall = getattr(f.request.headers, "getall", None)
        if getall is None:  # aiohttp's stand-in request for unparsable input
            return ""
        values = getall(header, ())
        return values[0] if len(values) == 1 else ", ".join(values)

    return get


def getter(name: str) -> Callable[[Fields], str]:
    if name.startswith("http_"):
        return _header_getter(name)
    return _GETTERS.get(name, lambda f: "")


def compile_template(template: str) -> Callable[[Fields], str]:
    """A template becomes a list of literals and pre-bound getters, rendered without lookups."""
    parts: list[tuple[str, Callable[[Fields], str] | None, bool, Callable[[str], str]]] = []
    pos = 0
    for match in _VAR.finditer(template):
        if match.start() > pos:
            parts.append((template[pos : match.start()], None, True, escape))
        name = match.group(1) or match.group(2)
        parts.append(("", getter(name), name in _SAFE, escape_word if name in _UNQUOTED else escape))
        pos = match.end()
    if pos < len(template):
        parts.append((template[pos:], None, True, escape))
    frozen = tuple(parts)
    needs_escape = NEEDS_ESCAPE.search

    def render(fields: Fields) -> str:
        out = []
        for literal, get, safe, escaped in frozen:
            if get is None:
                out.append(literal)
                continue
            value = get(fields)
            if not value:
                out.append("-")
            elif safe or (needs_escape(value) is None and escaped is escape):
                out.append(value)
            else:
                out.append(escaped(value))
        return "".join(out)

    return render


_JSON_TEXT = tuple((name, getter(name)) for name in JSON_FIELDS if name not in ("status", "body_bytes_sent"))
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _json_text(value: str) -> str:
    """A value the JSON line can hold: bytes that were not UTF-8 (surrogate escapes) become ``\\xHH``.

    The encoder escapes quotes, backslashes and control characters; a lone surrogate would
    make the line unwritable as UTF-8, and with it the whole batch it was flushed in."""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return value


def _render_json(fields: Fields) -> str:
    status = _status(fields)
    sent = _body_bytes(fields)
    record: dict[str, Any] = {name: _json_text(get(fields)) for name, get in _JSON_TEXT}
    record["status"] = int(status) if status.isdigit() else status
    record["body_bytes_sent"] = int(sent) if sent.isdigit() else sent
    record["request_time"] = round(fields.elapsed, 3)
    return _dumps(record)


_count = STATS.request
Observer = Callable[[str, int, str, str], None]  # (route label, status, $upstream_addr, $upstream_response_time)


class LogSink:
    """A buffered line writer flushed every 100 ms and at shutdown."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._buffer: list[str] = []
        self._scheduled = False
        self._stream: IO[str] | None
        if target == "off":
            self._stream = None
        elif target == "stdout":
            self._stream = sys.stdout
        elif target == "stderr":
            self._stream = sys.stderr
        else:
            self._stream = open(target, "a", encoding="utf-8", buffering=1 << 16)  # noqa: SIM115

    @property
    def enabled(self) -> bool:
        return self._stream is not None

    def write(self, line: str) -> None:
        if self._stream is None:
            return
        self._buffer.append(line)
        if not self._scheduled:
            self._scheduled = True
            try:
                asyncio.get_running_loop().call_later(0.1, self.flush)
            except RuntimeError:
                self.flush()

    def flush(self) -> None:
        self._scheduled = False
        if self._stream is None or not self._buffer:
            return
        data = "\n".join(self._buffer) + "\n"
        self._buffer.clear()
        try:
            try:
                self._stream.write(data)
            except UnicodeEncodeError:
                # Every format escapes what it renders; a line that still cannot be written as
                # UTF-8 is written escaped, and never takes the rest of the batch with it.
                self._stream.write(data.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"))
            self._stream.flush()
        except (OSError, ValueError):
            pass

    def reopen(self) -> None:
        """Reopen a log file (after rotation), like ``nginx -s reopen``."""
        self.flush()
        if self._stream is not None and self.target not in ("stdout", "stderr"):
            self._stream.close()
            self._stream = open(self.target, "a", encoding="utf-8", buffering=1 << 16)  # noqa: SIM115

    def close(self) -> None:
        self.flush()
        if self._stream is not None and self.target not in ("stdout", "stderr"):
            self._stream.close()
        self._stream = None


class AccessLog:
    """Formats one line per request and hands it to a sink."""

    def __init__(self, fmt: str, sink: LogSink, observer: Observer | None = None) -> None:
        self.sink = sink
        self.fmt = fmt
        self.observer = observer  # the status page's per-route counts (metrics/activity.py)
        self._clock = _Clock()
        if fmt == "json":
            self._render: Callable[[Fields], str] = _render_json
        else:
            self._render = compile_template(PRESETS.get(fmt, fmt))

    def write(
        self, ctx: RequestContext | None, request: BaseRequest, response: StreamResponse | None, elapsed: float
    ) -> None:
        # Every request ends here once (499s and aiohttp's own 400s included): the metrics too.
        if ctx is not None:
            route = ctx.route
            status = ctx.status or (response.status if response is not None else 0)
            label = route.label if route is not None else ""
            _count(label, status, elapsed)
            if self.observer is not None:
                self.observer(label, status, ctx.upstream_addr, ctx.upstream_time)
        else:
            _count("", response.status if response is not None else 0, elapsed)
        if not self.sink.enabled:
            return
        self._clock.refresh(time.time())
        try:
            line = self._render(Fields(ctx, request, response, elapsed, self._clock))
        except Exception:  # a log line must never take a request down
            errorlog.log.exception("could not format an access log line")
            return
        self.sink.write(line)


CTX_KEY = "gateway.ctx"


def aiohttp_logger_class(access_log: Callable[[], AccessLog]) -> type[AbstractAccessLogger]:
    """An aiohttp access-logger class that writes through our ``AccessLog``.

    aiohttp calls it after every response it finishes, including the 400s it
    produces itself for unparsable requests.
    """

    class _Logger(AbstractAccessLogger):
        def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
            ctx = request.get(CTX_KEY)
            if ctx is not None:
                if ctx.logged:
                    return
                ctx.logged = True
            access_log().write(ctx, request, response, time)

        @property
        def enabled(self) -> bool:
            return True

    return _Logger
