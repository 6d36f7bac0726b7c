"""``limit_req_zone``/``limit_conn_zone`` (the ``zones:``) and their uses in a route.

A route gets the ``limit_req``/``limit_conn`` lists it inherits (see ``scope``), each use
checked against the zones, then the status, log level and dry run settings.
"""

from __future__ import annotations

from gateway.nginxconf.parser import Directive
from gateway.nginxconf.result import Doc, Result, Route
from gateway.nginxconf.scope import Scope
from gateway.nginxconf.values import (
    LIMIT_LOG_LEVEL,
    LIMIT_STATUS,
    key_values,
    limit_req_entry,
    rate_problem,
    zone_problem,
)


class Limits:
    def __init__(self, result: Result) -> None:
        self.result = result
        self.zones: dict[str, Doc] = {}
        self.kind: dict[str, str] = {}  # zone name -> "req" or "conn"
        self.bad: set[str] = set()  # zones that were skipped: their uses are skipped too

    # -- the zones (http level) ----------------------------------------------------------------

    def limit_req_zone(self, d: Directive) -> None:
        params = key_values(d.args[1:])
        zone = params.get("zone", "")
        name, _, zone_size = zone.partition(":")
        problem = zone_problem(d, name, zone_size, self.result.defined) or rate_problem(params.get("rate"))
        unknown = set(params) - {"zone", "rate"}
        if not problem and unknown:
            problem = f"parameters {', '.join(sorted(unknown))} are not supported (sync is NGINX Plus)"
        if problem:
            self.bad.add(name)
            self.result.skip(d, problem)
            return
        self.zones[name] = {"type": "req", "key": d.args[0], "rate": params["rate"], "size": zone_size}
        self.kind[name] = "req"

    def limit_conn_zone(self, d: Directive) -> None:
        params = key_values(d.args[1:])
        name, _, zone_size = params.get("zone", "").partition(":")
        problem = zone_problem(d, name, zone_size, self.result.defined)
        if problem:
            self.bad.add(name)
            self.result.skip(d, problem)
            return
        self.zones[name] = {"type": "conn", "key": d.args[0], "size": zone_size}
        self.kind[name] = "conn"

    # -- their uses (a route) ------------------------------------------------------------------

    def for_route(self, route: Route, scope: Scope) -> None:
        """The route's ``limit_req``, ``limit_conn``, their statuses and log levels, and ``dry_run``."""
        self._uses(route, scope)
        for name in (*LIMIT_STATUS, *LIMIT_LOG_LEVEL):
            found = scope.get(name)
            if found is not None:
                route.data[name] = int(found.args[0]) if name in LIMIT_STATUS else found.args[0]
        self._dry_run(route, scope)

    def _uses(self, route: Route, scope: Scope) -> None:
        reqs: list[Doc] = []
        for d in scope.array("limit_req"):
            entry = limit_req_entry(d)
            zone = entry["zone"]
            if zone in self.bad:
                self.result.skip(d, f'zone "{zone}" was not translated (see its limit_req_zone)')
            elif self.kind.get(zone) != "req":
                self.result.skip(d, f'nginx: zero size shared memory zone "{zone}" (no limit_req_zone defines it)')
            elif zone in (e["zone"] for e in reqs):
                self.result.skip(d, f'nginx: the "limit_req" directive with zone "{zone}" is duplicate')
            else:
                reqs.append(entry)
        conns: list[Doc] = []
        for d in scope.array("limit_conn"):
            zone = d.args[0]
            if zone in self.bad:
                self.result.skip(d, f'zone "{zone}" was not translated (see its limit_conn_zone)')
            elif self.kind.get(zone) != "conn":
                self.result.skip(d, f'nginx: no limit_conn_zone defines "{zone}"')
            elif zone in (e["zone"] for e in conns):
                self.result.skip(d, f'nginx: the "limit_conn" directive with zone "{zone}" is duplicate')
            else:
                conns.append({"zone": zone, "max": int(d.args[1])})
        if reqs:
            route.data["limit_req"] = reqs
        if conns:
            route.data["limit_conn"] = conns

    def _dry_run(self, route: Route, scope: Scope) -> None:
        req_d, conn_d = scope.get("limit_req_dry_run"), scope.get("limit_conn_dry_run")
        req_on = req_d is not None and req_d.args[0] == "on"
        conn_on = conn_d is not None and conn_d.args[0] == "on"
        has_req, has_conn = "limit_req" in route.data, "limit_conn" in route.data
        if has_req and has_conn and req_on != conn_on:
            source = req_d if req_on else conn_d
            assert source is not None
            self.result.skip(
                source,
                f"route {route.data['location']}: the gateway has one dry_run for limit_req and limit_conn together",
            )
            return
        if (has_req and req_on) or (has_conn and conn_on):
            route.data["dry_run"] = True
