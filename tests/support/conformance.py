"""The store conformance suite's scaffolding: a fake clock, and routes played against a store.

The ``store`` and ``clock`` fixtures are in tests/conformance/conftest.py; the vectors are
the tests in tests/conformance/.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.limits import nginx_req
from gateway.plan import load_config_text
from gateway.plan.compiled import CompiledConfig, RoutePlan
from gateway.store.base import Store, Verdict
from tests.support.config import config as gateway_config

__all__ = ["T0", "FakeClock", "Outcome", "Scenario", "config", "req_status"]

T0 = 10**9  # a clock value far from zero, like nginx's (vectors say "clock value >> 0")


class FakeClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now

    def at(self, t: int) -> None:
        self.now = T0 + t


@dataclass
class Outcome:
    req: str  # "", PASSED, DELAYED, REJECTED (+ _DRY_RUN)
    delay_ms: int
    excess: int
    count: str
    verdict: Verdict


def req_status(verdict: Verdict, dry: bool) -> str:
    req = verdict.req
    if req is None or req.rc == nginx_req.DECLINED:
        return ""
    if req.rc >= nginx_req.BUSY:
        return "REJECTED_DRY_RUN" if dry else "REJECTED"
    if req.delay_ms:
        return "DELAYED_DRY_RUN" if dry else "DELAYED"
    return "PASSED"


class Scenario:
    """Routes compiled from YAML, played against a store at chosen clock values."""

    def __init__(self, store: Store, clock: FakeClock, yaml_text: str) -> None:
        self.store = store
        self.clock = clock
        self.config: CompiledConfig = load_config_text(yaml_text)
        store.configure(self.config.spec.zones)
        self.routes: dict[str, RoutePlan] = {r.location.value: r for r in self.config.routes}

    async def hit(
        self,
        location: str,
        t: int,
        req: list[bytes] | bytes | None = None,
        count: list[bytes] | bytes | None = None,
        conn: list[bytes] | bytes | None = None,
        algo: list[bytes] | bytes | None = None,
        cost: int | None = None,
    ) -> Outcome:
        route = self.routes[location]
        self.clock.at(t)
        rk = _keys(req, len(route.limit_req))
        ck = _keys(count, len(route.limit_count))
        nk = _keys(conn, len(route.limit_conn))
        ak = _keys(algo, len(route.limit_algo))
        uses = [(k, lim.cost if cost is None else cost) for k, lim in zip(ak, route.limit_algo, strict=True)]
        verdict = await self.store.admit(route, rk, ck, nk, uses)
        count_status = ""
        if route.limit_count:
            if verdict.count_rejected >= 0:
                count_status = "REJECTED"
            elif any(u is not None for u in verdict.count_used):
                count_status = "PASSED"
        req_dec = verdict.req
        return Outcome(
            req=req_status(verdict, route.dry_run),
            delay_ms=req_dec.delay_ms if req_dec else 0,
            excess=req_dec.excess if req_dec else 0,
            count=count_status,
            verdict=verdict,
        )


def _keys(value: list[bytes] | bytes | None, n: int) -> list[bytes]:
    if value is None:
        return [b"k"] * n
    if isinstance(value, bytes):
        return [value] * n
    return value


def config(zones: str, routes: str) -> str:
    """Zones and routes for a store under test (the upstream is never reached)."""
    return gateway_config("127.0.0.1:9", zones=zones, routes=routes)(8080)
