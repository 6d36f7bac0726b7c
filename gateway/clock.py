"""The clocks, in milliseconds, and the deadline timer, defined once.

* ``epoch_ms``: wall-clock time, for state shared with other nodes (Redis scripts,
  bans), as OpenResty passes ``ngx.now() * 1000``;
* ``monotonic_ms``: this process's own clock, for state no other process reads;
* ``Deadline``: a timer for a reply's deadline, judged after the loop has read its sockets.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


def epoch_ms() -> int:
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


# The event loop runs its due timers before it polls its sockets. After an iteration that
# took longer than a timeout (a busy process), a reply may be waiting unread when the timer
# fires: a deadline is judged on a second timer this much later, in the next iteration,
# after that poll (libuv's timers have 1 ms resolution).
POLL_GRACE_S = 0.001


class Deadline:
    """``callback(*args)`` once ``delay`` has passed and the loop has polled its sockets once
    more (``POLL_GRACE_S``), unless cancelled first: a reply read meanwhile cancels it."""

    __slots__ = ("_args", "_callback", "_handle")

    def __init__(self, delay: float, callback: Callable[..., None], *args: Any) -> None:
        self._callback = callback
        self._args = args
        self._handle = asyncio.get_running_loop().call_later(delay, self._due)

    def _due(self) -> None:
        self._handle = asyncio.get_running_loop().call_later(POLL_GRACE_S, self._fire)

    def _fire(self) -> None:
        args, self._args = self._args, ()  # (as cancel: not held past the deadline)
        self._callback(*args)

    def cancel(self) -> None:
        self._handle.cancel()
        # The arguments often hold what holds this deadline (a batch and its timer): let go
        # of them, so that the pair is freed at once, not by the cyclic collector.
        self._args = ()
