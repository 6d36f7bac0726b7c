"""The circuit breaker of the Redis store, its probe, and the counts a metrics exporter reads.

Two failed calls in a row (a timeout or a broken connection, not an error reply) open
the circuit: calls then fail at once, and a probe PINGs every ``PROBE_EVERY_S`` and
closes it when Redis answers again (and the scripts are loaded).

``calls`` counts Redis calls (batches) by outcome: ok, error (an error reply), timeout,
unavailable (connection refused or lost) and circuit_open (refused without a call).
``observers`` are called with every call's outcome (as ``calls`` counts it) and its duration in
seconds (0 for circuit_open: no call was made).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.background import spawn
from gateway.logs import error as errorlog

PROBE_EVERY_S = 0.1
FAILURES_TO_OPEN = 2
OUTCOMES = ("ok", "error", "timeout", "unavailable", "circuit_open")


class Breaker:
    def __init__(self, on_error: str = "local") -> None:
        self.failures = 0
        self.open = False
        self.opened_at = 0.0
        self.openings = 0
        self.on_error = on_error
        self.calls: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        self.observers: list[Callable[[str, float], None]] = []
        self.on_close: list[Callable[[], None]] = []  # called when the probe closes the circuit
        self._probe: asyncio.Task[Any] | None = None
        self._ping: Callable[[], Awaitable[Any]] | None = None

    @property
    def state(self) -> str:
        return "open" if self.open else "closed"

    def success(self) -> None:
        self.failures = 0

    def failure(self) -> bool:
        """Count a failure; True when this one opened the circuit."""
        self.failures += 1
        if not self.open and self.failures >= FAILURES_TO_OPEN:
            self.trip()
            return True
        return False

    def observe(self, outcome: str, seconds: float) -> None:
        self.calls[outcome] += 1
        for observer in self.observers:
            observer(outcome, seconds)

    def probe_with(self, ping: Callable[[], Awaitable[Any]]) -> None:
        """What the probe runs: PING, then load the scripts (bounded by the caller)."""
        self._ping = ping

    def trip(self) -> None:
        """Open the circuit (also at start when Redis is not there) and start the probe."""
        if not self.open:
            self.openings += 1
            self.opened_at = time.monotonic()
        self.open = True
        errorlog.log.error(
            "Redis circuit open: calls fail fast, on_error=%s, probing every %d ms",
            self.on_error,
            PROBE_EVERY_S * 1000,
        )
        if self._ping is not None and (self._probe is None or self._probe.done()):
            self._probe = spawn(self._probe_loop())

    async def _probe_loop(self) -> None:
        assert self._ping is not None
        while True:
            await asyncio.sleep(PROBE_EVERY_S)
            try:
                await self._ping()
            except Exception:
                continue
            self.open = False
            self.failures = 0
            errorlog.log.log(errorlog.NOTICE, "Redis answers again: circuit closed")
            for callback in self.on_close:
                callback()
            return

    def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
