"""One description of a limits experiment, from which both configurations and the model are derived.

A ``Scenario`` names zones, locations (each with its ``limit_req`` / ``limit_conn``
list) and a schedule of requests ``(t_ms, location, args)``. Several scenarios
are hosted by one nginx and one gateway: zone names are prefixed with the
scenario name and locations live under ``/echo/<scenario>/<location>/``, so
scenarios never share state.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ReqZone:
    """``limit_req_zone KEY zone=NAME:1m rate=RATE``."""

    name: str
    key: str
    rate: str  # "2r/s", "30r/m", as nginx writes it

    @property
    def rate_m(self) -> int:
        """nginx's stored rate in milli-requests per second (r/m truncated: 1r/m -> 16)."""
        match = re.fullmatch(r"(\d+)r/([sm])", self.rate)
        assert match, self.rate
        return int(match.group(1)) * 1000 // (1 if match.group(2) == "s" else 60)


@dataclass(frozen=True)
class ConnZone:
    """``limit_conn_zone KEY zone=NAME:1m``."""

    name: str
    key: str


@dataclass(frozen=True)
class LimitReq:
    zone: str
    burst: int = 0
    delay: int = 0
    nodelay: bool = False


@dataclass(frozen=True)
class LimitConn:
    zone: str
    max: int


@dataclass(frozen=True)
class Location:
    name: str
    limit_req: tuple[LimitReq, ...] = ()
    limit_conn: tuple[LimitConn, ...] = ()
    limit_req_status: int = 503
    limit_conn_status: int = 503
    dry_run: bool = False  # limit_req_dry_run on + limit_conn_dry_run on


@dataclass(frozen=True)
class Request:
    """A request sent ``t`` ms after the scenario start; ``hold`` ms is spent in the upstream."""

    t: int
    loc: str
    args: tuple[tuple[str, str], ...] = ()
    hold: int = 0
    note: str = ""

    def group_key(self) -> tuple[object, ...]:
        """Requests with the same key are interchangeable: compared as a multiset."""
        return (self.t, self.loc, self.args, self.hold)


def req(t: int, loc: str, hold: int = 0, note: str = "", **args: str) -> Request:
    return Request(t, loc, tuple(sorted(args.items())), hold, note)


@dataclass(frozen=True)
class Scenario:
    name: str
    zones: tuple[ReqZone | ConnZone, ...]
    locations: tuple[Location, ...]
    requests: tuple[Request, ...]
    doc: str = ""
    jitter_ms: int | None = None  # None: the suite's default
    start_offset_ms: int = 0  # set by the runner to stagger scenarios
    extra: dict[str, object] = field(default_factory=dict)

    def zone(self, name: str) -> ReqZone | ConnZone:
        for z in self.zones:
            if z.name == name:
                return z
        raise KeyError(name)

    def location(self, name: str) -> Location:
        for loc in self.locations:
            if loc.name == name:
                return loc
        raise KeyError(name)

    # names as both servers see them
    def zone_name(self, zone: str) -> str:
        return f"{self.name}__{zone}"

    def path(self, loc: str) -> str:
        return f"/echo/{self.name}/{loc}/"

    @property
    def duration_ms(self) -> int:
        return max(r.t + r.hold for r in self.requests)


_VAR = re.compile(r"\$([A-Za-z0-9_]+)")
CLIENT = "127.0.0.1"  # every request comes from the test process
_FIXED = {"remote_addr": CLIENT, "binary_remote_addr": "\x7f\x00\x00\x01"}


def eval_key(template: str, args: dict[str, str]) -> str:
    """The subset of nginx complex values the scenarios use: text, ``$arg_NAME`` and the client address."""

    def value(m: re.Match[str]) -> str:
        name = m.group(1)
        if name.startswith("arg_"):
            return args.get(name[4:], "")
        return _FIXED[name]

    return _VAR.sub(value, template)
