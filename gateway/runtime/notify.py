"""systemd's readiness protocol (``sd_notify``): one datagram to ``$NOTIFY_SOCKET``.

With ``Type=notify`` (``contrib/systemd/gateway.service``) systemd waits for ``READY=1`` before
it calls the service started, shows ``RELOADING=1`` ... ``READY=1`` as a reload, and
``STOPPING=1`` as a drain. Only the main process speaks: the master of ``workers: N`` (its
workers get an environment without ``NOTIFY_SOCKET``), or the single serving process. Without
``$NOTIFY_SOCKET`` (not under systemd) every call does nothing. A failed send is logged once
and never stops the gateway: readiness is advice to the service manager.
"""

from __future__ import annotations

import os
import socket
import time

from gateway.logs import error as errorlog

ENV = "NOTIFY_SOCKET"
_failed = False


def notify(*fields: str) -> bool:
    """Send ``fields`` (``"READY=1"``, ``"STATUS=..."``) as one message; True if it was sent."""
    global _failed
    address = _address(os.environ.get(ENV, ""))
    if address is None:
        return False
    message = "\n".join(fields).encode("utf-8", "replace")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(message, socket.MSG_DONTWAIT, address)
    except OSError as exc:
        if not _failed:
            _failed = True
            errorlog.log.warning("could not notify systemd through %s: %s", os.environ.get(ENV), exc)
        return False
    return True


def ready(status: str = "") -> bool:
    return notify("READY=1", *([f"STATUS={status}"] if status else []))


def reloading() -> bool:
    """``RELOADING=1`` with the monotonic time systemd 253+ matches the reload by."""
    return notify("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")


def stopping() -> bool:
    return notify("STOPPING=1")


def child_environment(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a worker process: without the socket, so only the main process notifies."""
    env.pop(ENV, None)
    return env


def _address(value: str) -> str | bytes | None:
    """A path, or ``@name`` for an abstract socket; None when unset or of another kind (vsock)."""
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return b"\0" + value[1:].encode("utf-8", "surrogateescape")
    return None
