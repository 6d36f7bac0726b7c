"""What a zone of the newer algorithms (gcra, ...) answers for one request.

These zones are used through a route's ``limits:`` list; their answers travel in
``Verdict.algo`` as plain tuples-of-ints friendly objects (the shared store
marshals them), and ``gateway/pipeline/limiting.py`` turns them into status variables,
error log lines and RateLimit / Retry-After headers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AlgoOutcome:
    allowed: bool
    limit: int  # the policy's quota (RateLimit-Policy q)
    remaining: int  # requests (units) that would pass right now
    retry_after_s: int  # when rejected: seconds until it could pass (-1: never, as it is)
    reset_s: int  # seconds until the state is back to full
    delay_ms: int = 0  # token: how long the request waits for its permit before it goes

    def encode(self) -> tuple[int, int, int, int, int, int]:
        return (1 if self.allowed else 0, self.limit, self.remaining, self.retry_after_s, self.reset_s, self.delay_ms)

    @classmethod
    def decode(cls, raw: tuple[int, ...] | list[int]) -> AlgoOutcome:
        allowed, limit, remaining, retry, reset, delay = raw
        return cls(bool(allowed), int(limit), int(remaining), int(retry), int(reset), int(delay))
