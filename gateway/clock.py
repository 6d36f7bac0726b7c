"""The clocks, in milliseconds, defined once.

* ``epoch_ms``: wall-clock time, for state shared with other nodes (Redis scripts,
  bans), as OpenResty passes ``ngx.now() * 1000``;
* ``monotonic_ms``: this process's own clock, for state no other process reads.
"""

from __future__ import annotations

import time


def epoch_ms() -> int:
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000
