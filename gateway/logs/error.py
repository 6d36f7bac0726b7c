"""The error log, in nginx's format.

``2026/11/22 10:00:00 [error] 4242#0: *17 limiting requests, excess: 2.000 by zone "per_ip",
client: 192.0.2.1, server: , request: "GET / HTTP/1.1", host: "example.com"``

Levels are nginx's: debug, info, notice, warn, error, crit, alert, emerg.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import TYPE_CHECKING

from gateway.logs.escape import escape

if TYPE_CHECKING:
    from gateway.http.context import RequestContext

NOTICE = 25
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "notice": NOTICE,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "crit": logging.CRITICAL,
    "alert": logging.CRITICAL + 5,
    "emerg": logging.CRITICAL + 10,
}
_NAMES = {value: name for name, value in LEVELS.items()}
logging.addLevelName(NOTICE, "NOTICE")

log = logging.getLogger("gateway")


class _ClientErrors(logging.Filter):
    """aiohttp reports unparsable requests with a traceback; nginx logs them at info, one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and type(exc).__name__ in _CLIENT_ERRORS:
            record.levelno = logging.INFO
            record.levelname = "INFO"
            message = getattr(exc, "message", str(exc)).replace("\n", " ")
            record.msg = "client sent invalid request (%s), client: %s"
            peer = record.args[0] if isinstance(record.args, tuple) and record.args else "-"
            record.args = (" ".join(message.split()), peer)
            record.exc_info = None
            return log.isEnabledFor(logging.INFO)
        return True


_CLIENT_ERRORS = {
    "BadHttpMessage",
    "BadHttpMethod",
    "BadStatusLine",
    "InvalidHeader",
    "LineTooLong",
    "InvalidURLError",
    "TransferEncodingError",
    "ContentLengthError",
    "HttpProcessingError",
}


class NginxFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(record.created))
        level = _NAMES.get(record.levelno, record.levelname.lower())
        message = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            # Unexpected exceptions are bugs: keep the traceback, indented under the line.
            trace = self.formatException(record.exc_info).replace("\n", "\n    ")
            message = f"{message}: {record.exc_info[1]!r}\n    {trace}"
        return f"{stamp} [{level}] {os.getpid()}#0: {message}"


def configure(target: str, level: str) -> None:
    """Send the error log to stderr, stdout or a file, at an nginx level or above."""
    handler: logging.Handler
    if target == "stderr":
        handler = logging.StreamHandler(sys.stderr)
    elif target == "stdout":
        handler = logging.StreamHandler(sys.stdout)
    elif target == "off":
        handler = logging.NullHandler()
    else:
        handler = logging.FileHandler(target, encoding="utf-8")
    handler.setFormatter(NginxFormatter())
    handler.addFilter(_ClientErrors())
    for logger in (log, logging.getLogger("aiohttp"), logging.getLogger("asyncio")):
        for old in list(logger.handlers):
            logger.removeHandler(old)
            old.close()
        logger.addHandler(handler)
        logger.propagate = False
    log.setLevel(LEVELS.get(level, NOTICE))
    # aiohttp's own access logger is replaced by ours; its server errors are real errors.
    logging.getLogger("aiohttp.access").disabled = True
    logging.getLogger("aiohttp").setLevel(logging.ERROR)


def request_suffix(ctx: RequestContext) -> str:
    """nginx's ``client: ..., request: "...", host: "..."``; what the client wrote is escaped
    as in the access log, so a ``Host: x", client: 6.6.6.6`` cannot forge a field."""
    version = ctx.version
    parts = [
        f"client: {ctx.client.text}",
        f"server: {ctx.server.name if ctx.server is not None else ''}",
        f'request: "{escape(ctx.method)} {escape(ctx.request_target)} HTTP/{version.major}.{version.minor}"',
    ]
    if ctx.upstream_addr:
        parts.append(f'upstream: "{ctx.upstream_addr}"')
    host = ctx.headers.get("Host")
    if host:
        parts.append(f'host: "{escape(host)}"')
    return ", ".join(parts)


def request_event(level: str, ctx: RequestContext, message: str) -> None:
    """Log a message about one request with nginx's ``client: ..., request: ...`` suffix."""
    levelno = LEVELS[level]
    if log.isEnabledFor(levelno):
        log.log(levelno, "%s, %s", message, request_suffix(ctx))
