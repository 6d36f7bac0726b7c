"""The clocks, in milliseconds, defined once.

* ``epoch_ms``: wall-clock time, for state shared with other nodes (Redis scripts,
  bans), as OpenResty passes ``ngx.now() * 1000``;
* ``monotonic_ms``: this process's own clock, for state no other process reads;
* ``POLL_GRACE_S``: how long a deadline on a reply waits past its timer (see below).
"""

from __future__ import annotations

import time


def epoch_ms() -> int:
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


# The event loop runs its due timers before it polls its sockets. After an iteration that
# took longer than a timeout (a busy process), a reply may be waiting unread when the timer
# fires: a deadline is judged on a second timer this much later, in the next iteration,
# after that poll (libuv's timers have 1 ms resolution).
POLL_GRACE_S = 0.001
