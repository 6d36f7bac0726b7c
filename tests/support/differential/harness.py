"""Drive scenarios through the real nginx and through the gateway, and compare.

* ``nginx_conf`` / ``gateway_yaml``: the two configurations, generated from the same scenarios;
* ``Nginx``: the nginx binary as a child process in a temporary prefix;
* ``replay``: one scenario's schedule against one target (aiohttp, one connection per request);
* ``compare``: observed results of both targets against each other and against the model's
  jitter analysis (``model.analyse``).

Tolerances (all in ms), computed rather than guessed:

* J (``jitter_ms``): how far the server's view of a request's arrival may differ from its
  nominal offset (client scheduling, connection setup, nginx's per-iteration cached clock,
  integer milliseconds). The model is re-run with every arrival moved by up to ±J (and
  same-millisecond events in random order); a request whose outcome differs between runs is
  *boundary-sensitive* and may show any outcome the model produced; every other request must
  show the model's single outcome on both targets.
  J is the configured base (DIFF_JITTER_MS, default 25) plus the worst lateness of the
  client itself in that scenario (actual send time - scheduled time, measured): a request
  the client sent 8 ms late is still covered by the model.
* Latency of request i on target T, with [Dmin, Dmax] the model's range of its duration (real
  delay + upstream hold) over the runs that gave the observed outcome, B_T the target's
  no-limit overhead measured just before the replay (B_T = 2 * max(baseline latencies) + 5)
  and L the worst stall of the client's event loop during the replay (measured by a 5 ms
  ticker; a stall delays reading a response):

      Dmin - J  <=  latency_T  <=  Dmax + J + B_T + L

  (a delay timer may start from a clock up to J early, and ends up to J late plus the
  normal proxying overhead).
* nginx vs gateway latency, same request and outcome:

      |latency_nginx - latency_gateway|  <=  (Dmax - Dmin) + 2J + max(B_nginx, B_gateway) + L

* The excess printed in "limiting requests" / "delaying request" error-log lines must lie in
  the model's [min, max] over the runs (this is where r/m truncation, rate_m = N*1000//60,
  and the per-commit loss of the leak's fraction show within a few seconds), widened by
  what a stall of L ms is worth at the location's fastest rate (``excess_slack``):

      min - ceil(L * rate_m / 1000)  <=  excess_T  <=  max + ceil(L * rate_m / 1000)
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import aiohttp
import yaml
from aiohttp import web

from tests.support.differential.model import Analysis, Possible, analyse, canonical
from tests.support.differential.scenario import ConnZone, Location, ReqZone, Scenario
from tests.support.gateway import Gateway
from tests.support.nginx import NginxProcess, single_worker_conf


def _limit_req_nginx(scn: Scenario, loc: Location) -> list[str]:
    out = []
    for lim in loc.limit_req:
        words = [f"zone={scn.zone_name(lim.zone)}"]
        if lim.burst:
            words.append(f"burst={lim.burst}")
        if lim.nodelay:
            words.append("nodelay")
        elif lim.delay:
            words.append(f"delay={lim.delay}")
        out.append(f"limit_req {' '.join(words)};")
    return out


def nginx_conf(workdir: Path, port: int, upstream: str, scenarios: list[Scenario]) -> str:
    d = str(workdir)
    zones = []
    locations = []
    for scn in scenarios:
        for z in scn.zones:
            if isinstance(z, ReqZone):
                zones.append(f"limit_req_zone {z.key} zone={scn.zone_name(z.name)}:1m rate={z.rate};")
            else:
                zones.append(f"limit_conn_zone {z.key} zone={scn.zone_name(z.name)}:1m;")
        for loc in scn.locations:
            body = _limit_req_nginx(scn, loc)
            body += [f"limit_conn {scn.zone_name(lim.zone)} {lim.max};" for lim in loc.limit_conn]
            body += [f"limit_req_status {loc.limit_req_status};", f"limit_conn_status {loc.limit_conn_status};"]
            if loc.dry_run:
                body += ["limit_req_dry_run on;", "limit_conn_dry_run on;"]
            body += [f"proxy_pass http://{upstream};"]
            inner = "\n            ".join(body)
            locations.append(f"        location {scn.path(loc.name)} {{\n            {inner}\n        }}")
    zone_text = "\n    ".join(zones)
    location_text = "\n".join(locations)
    log_format = (
        '{"status":$status,"request_time":$request_time,"limit_req_status":"$limit_req_status",'
        '"limit_conn_status":"$limit_conn_status","request_uri":"$request_uri","msec":$msec}'
    )
    http = f"""    log_format differential escape=json '{log_format}';
    access_log {d}/access.log differential;
    proxy_read_timeout 30s;

    {zone_text}

    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://{upstream};
        }}
{location_text}
    }}
"""
    return single_worker_conf(workdir, http, worker_connections=4096)


def gateway_yaml(port: int, upstream: str, scenarios: list[Scenario]) -> str:
    zones: dict[str, dict[str, object]] = {}
    routes: list[dict[str, object]] = [{"location": "/", "upstream": "app"}]
    for scn in scenarios:
        for z in scn.zones:
            if isinstance(z, ReqZone):
                zones[scn.zone_name(z.name)] = {"type": "req", "key": z.key, "rate": z.rate, "size": "1m"}
            else:
                assert isinstance(z, ConnZone)
                zones[scn.zone_name(z.name)] = {"type": "conn", "key": z.key, "size": "1m"}
        for loc in scn.locations:
            route: dict[str, object] = {"location": scn.path(loc.name), "upstream": "app"}
            if loc.limit_req:
                entries = []
                for lim in loc.limit_req:
                    entry: dict[str, object] = {"zone": scn.zone_name(lim.zone)}
                    if lim.burst:
                        entry["burst"] = lim.burst
                    if lim.nodelay:
                        entry["nodelay"] = True
                    elif lim.delay:
                        entry["delay"] = lim.delay
                    entries.append(entry)
                route["limit_req"] = entries
            if loc.limit_conn:
                route["limit_conn"] = [{"zone": scn.zone_name(lim.zone), "max": lim.max} for lim in loc.limit_conn]
            route["limit_req_status"] = loc.limit_req_status
            route["limit_conn_status"] = loc.limit_conn_status
            if loc.dry_run:
                route["dry_run"] = True
            routes.append(route)
    doc = {
        "listen": f"127.0.0.1:{port}",
        "shutdown_timeout": "2s",
        "admin": {"listen": "off"},
        "log": {"format": "json", "level": "info"},
        "zones": zones,
        "upstreams": {"app": {"servers": [upstream], "read_timeout": "30s"}},
        "routes": routes,
    }
    return yaml.safe_dump(doc, sort_keys=False)


# -- nginx as a child process ------------------------------------------------------------------------


class Nginx(NginxProcess):
    """nginx with the JSON access log that ``nginx_conf`` writes to ``workdir/access.log``."""

    def __init__(self, binary: str, workdir: Path, conf_text: str, port: int) -> None:
        super().__init__(binary, workdir, conf_text, port)
        self.access_log = workdir / "access.log"

    def access(self) -> list[dict[str, object]]:
        if not self.access_log.exists():
            return []
        return [json.loads(line) for line in self.access_log.read_text().splitlines() if line.strip()]


# -- replay ------------------------------------------------------------------------------------------


@dataclass
class Observed:
    status: int = 0
    limit_req_status: str = ""
    limit_conn_status: str = ""
    latency_ms: float = 0.0
    lateness_ms: float = 0.0  # client side: actual send time - scheduled time
    excess: int | None = None  # from the error log
    log_lines: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def key(self) -> tuple[int, str, str]:
        return (self.status, self.limit_req_status, self.limit_conn_status)


def rid(scn: Scenario, i: int) -> str:
    return f"{scn.name}.{i}"


def url_of(base: str, scn: Scenario, i: int) -> str:
    r = scn.requests[i]
    args = list(r.args)
    if r.hold:
        args.append(("hold", str(r.hold)))
    args.append(("rid", rid(scn, i)))
    return f"{base}{scn.path(r.loc)}?{urlencode(args)}"


async def _one(session: aiohttp.ClientSession, url: str, at: float, out: Observed) -> None:
    loop = asyncio.get_running_loop()
    delay = at - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)
    sent = loop.time()
    out.lateness_ms = (sent - at) * 1000
    try:
        async with session.get(url, allow_redirects=False) as resp:
            await resp.read()
            out.status = resp.status
    except Exception as exc:  # recorded, reported by compare()
        out.error = repr(exc)
    out.latency_ms = (loop.time() - sent) * 1000


async def replay(session: aiohttp.ClientSession, base: str, scn: Scenario, start: float) -> list[Observed]:
    """Send every request of ``scn`` at ``start`` (loop time, s) + its offset; one connection each."""
    observed = [Observed() for _ in scn.requests]
    t0 = start + scn.start_offset_ms / 1000
    await asyncio.gather(
        *(_one(session, url_of(base, scn, i), t0 + r.t / 1000, observed[i]) for i, r in enumerate(scn.requests))
    )
    return observed


async def baseline(session: aiohttp.ClientSession, base: str, samples: int = 8) -> list[float]:
    """Latency of unlimited requests (location /): the proxying overhead of one target."""
    out = []
    loop = asyncio.get_running_loop()
    for i in range(samples):
        started = loop.time()
        async with session.get(f"{base}/echo/baseline?i={i}") as resp:
            await resp.read()
            assert resp.status == 200, resp.status
        out.append((loop.time() - started) * 1000)
    concurrent = await asyncio.gather(*(_timed(session, f"{base}/echo/baseline?c={i}") for i in range(4)))
    return out + list(concurrent)


async def _timed(session: aiohttp.ClientSession, url: str) -> float:
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with session.get(url) as resp:
        await resp.read()
    return (loop.time() - started) * 1000


def new_session() -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=15))


# -- logs ----------------------------------------------------------------------------------------------

_LIMIT_LINE = re.compile(
    r"(limiting requests|delaying request)(, dry run)?, excess: (\d+)\.(\d{3}),? by zone \"([^\"]+)\""
    r".*?request: \"[A-Z]+ (\S+) HTTP/"
)


def _rid_of(uri: str) -> str | None:
    values = parse_qs(urlsplit(uri).query).get("rid")
    return values[0] if values else None


def attach_logs(observed: dict[str, Observed], access: list[dict[str, object]], errors: str) -> None:
    """Fill statuses from access-log records and excesses from error-log lines, by request id."""
    for rec in access:
        key = _rid_of(str(rec.get("request_uri", "")))
        if key is None or key not in observed:
            continue
        obs = observed[key]
        for name in ("limit_req_status", "limit_conn_status"):
            value = str(rec.get(name) or "")
            setattr(obs, name, "" if value == "-" else value)
    for line in errors.splitlines():
        m = _LIMIT_LINE.search(line)
        if not m:
            continue
        key = _rid_of(m.group(6))
        if key is None or key not in observed:
            continue
        obs = observed[key]
        obs.log_lines.append(line[line.find("]") + 1 :].strip()[:160])
        obs.excess = int(m.group(3)) * 1000 + int(m.group(4))


# -- comparison ----------------------------------------------------------------------------------------


@dataclass
class Comparison:
    scenario: Scenario
    analysis: Analysis
    nginx: list[Observed]  # canonical order
    gateway: list[Observed]
    overhead: dict[str, float]
    loop_lag_ms: float
    errors: list[str] = field(default_factory=list)
    rows: list[str] = field(default_factory=list)

    def report(self) -> str:
        scn = self.scenario
        head = (
            f"scenario {scn.name}: J={self.analysis.jitter_ms} ms, {self.analysis.runs} model runs, "
            f"overhead B nginx={self.overhead['nginx']:.1f} ms gateway={self.overhead['gateway']:.1f} ms, "
            f"client loop stall L={self.loop_lag_ms:.1f} ms, "
            f"max client lateness nginx={max(o.lateness_ms for o in self.nginx):.1f} ms "
            f"gateway={max(o.lateness_ms for o in self.gateway):.1f} ms"
        )
        return "\n".join([head, *self.rows, *(["ERRORS:"] + self.errors if self.errors else [])])


def _fmt_possible(possible: dict[tuple[int, str, str], Possible]) -> str:
    parts = []
    for key, p in sorted(possible.items(), key=lambda kv: -kv[1].count):
        exc = "" if p.excess is None else f" excess {p.excess[0]}..{p.excess[1]}"
        parts.append(f"{key[0]} {key[1] or '-'}/{key[2] or '-'} d={p.duration[0]}..{p.duration[1]}{exc} ({p.count})")
    return " | ".join(parts)


def _fmt_obs(o: Observed) -> str:
    exc = "" if o.excess is None else f" excess {o.excess}"
    err = f" ERROR {o.error}" if o.error else ""
    return f"{o.status} {o.limit_req_status or '-'}/{o.limit_conn_status or '-'} {o.latency_ms:.0f}ms{exc}{err}"


def excess_slack(scn: Scenario, loc: str, loop_lag_ms: float) -> int:
    """How far a stall of ``loop_lag_ms`` can move a logged excess, in nginx's milli-requests.

    J covers the client's lateness up to the moment it stamps a request as sent. A stall after
    that stamp (connection set-up, the write) delays the request's arrival by up to the stall
    and shows only in L, the client loop's worst stall. An arrival moved by L ms changes the
    leak by L * rate_m / 1000 at the location's fastest zone, either way.
    """
    rates = [zone.rate_m for lr in scn.location(loc).limit_req if isinstance(zone := scn.zone(lr.zone), ReqZone)]
    return math.ceil(loop_lag_ms * max(rates, default=0) / 1000)


def compare(
    scn: Scenario,
    analysis: Analysis,
    nginx_obs: list[Observed],
    gateway_obs: list[Observed],
    overhead: dict[str, float],
    loop_lag_ms: float = 0.0,
) -> Comparison:
    J = analysis.jitter_ms
    L = loop_lag_ms
    targets = {}
    for name, obs in (("nginx", nginx_obs), ("gateway", gateway_obs)):
        perm = canonical(scn, [(o.key, o.excess, o.latency_ms) for o in obs])
        targets[name] = [obs[p] for p in perm]
    cmp = Comparison(scn, analysis, targets["nginx"], targets["gateway"], overhead, L)
    for i, r in enumerate(scn.requests):
        slack = excess_slack(scn, r.loc, L)
        possible = analysis.possible[i]
        tag = "~" if analysis.sensitive(i) else " "
        args = "&".join(f"{k}={v}" for k, v in r.args) or "-"
        where = f"#{i:<2} t={r.t:<5} {r.loc}?{args}{f' hold={r.hold}' if r.hold else ''}"
        cmp.rows.append(f"{tag}{where}\n      model:   {_fmt_possible(possible)}")
        per_target: dict[str, tuple[Observed, Possible | None]] = {}
        excess_outside: dict[str, tuple[int, tuple[int, int]]] = {}
        errors_before = len(cmp.errors)
        for name in ("nginx", "gateway"):
            o = targets[name][i]
            cmp.rows.append(f"      {name + ':':8} {_fmt_obs(o)}")
            problem = f"{where}: {name}"
            if o.error:
                cmp.errors.append(f"{problem} request failed: {o.error}")
                continue
            p = possible.get(o.key)
            per_target[name] = (o, p)
            if p is None:
                cmp.errors.append(
                    f"{problem} gave {o.key}, the model allows only {sorted(possible)}"
                    + (" (boundary-sensitive)" if analysis.sensitive(i) else "")
                )
                continue
            # the error-log excess
            if p.excess is not None and o.excess is None and not p.excess_missing:
                cmp.errors.append(f"{problem}: no limiting/delaying log line, model expects excess {p.excess}")
            elif o.excess is not None:
                if p.excess is None:
                    cmp.errors.append(f"{problem}: unexpected log line with excess {o.excess}: {o.log_lines}")
                elif not p.excess[0] - slack <= o.excess <= p.excess[1] + slack:
                    excess_outside[name] = (o.excess, p.excess)
                    cmp.errors.append(
                        f"{problem}: logged excess {o.excess} outside the model's {p.excess[0]}..{p.excess[1]}"
                        + (f" ± {slack} (L={L:.1f} ms)" if slack else "")
                    )
            # latency
            lo = p.duration[0] - J
            hi = p.duration[1] + J + overhead[name] + L
            if not lo <= o.latency_ms <= hi:
                cmp.errors.append(
                    f"{problem}: latency {o.latency_ms:.1f} ms outside [{lo:.1f}, {hi:.1f}] "
                    f"(model duration {p.duration[0]}..{p.duration[1]}, J={J}, B={overhead[name]:.1f}, L={L:.1f})"
                )
        if set(excess_outside) == {"nginx", "gateway"}:
            # nginx itself is outside the model: the requests' spacing was not what the model
            # allows at this jitter (a stall longer than J on the test machine). nginx is the
            # reference then; the gateway passes if it logged what nginx logged, within the
            # model's own spread.
            (n_excess, (lo_e, hi_e)), (g_excess, _) = excess_outside["nginx"], excess_outside["gateway"]
            if abs(n_excess - g_excess) <= hi_e - lo_e:
                cmp.errors[errors_before:] = [e for e in cmp.errors[errors_before:] if "logged excess" not in e]
                cmp.rows.append(f"      (both logged excess outside the model: nginx {n_excess}, gateway {g_excess})")
        if len(per_target) == 2:
            (on, pn), (og, _) = per_target["nginx"], per_target["gateway"]
            if not analysis.sensitive(i) and on.key != og.key:
                cmp.errors.append(f"{where}: nginx {on.key} != gateway {og.key}")
            if on.key == og.key and pn is not None:
                bound = (pn.duration[1] - pn.duration[0]) + 2 * J + max(overhead.values()) + L
                if abs(on.latency_ms - og.latency_ms) > bound:
                    cmp.errors.append(
                        f"{where}: latency nginx {on.latency_ms:.1f} vs gateway {og.latency_ms:.1f} ms "
                        f"differ by more than {bound:.1f}"
                    )
    return cmp


@dataclass
class Run:
    """Everything one replay produced: per-scenario verdicts and both error logs."""

    comparisons: dict[str, Comparison]
    nginx_error_log: str
    gateway_stderr: str
    workdir: Path


# -- the whole run -------------------------------------------------------------------------------------


def default_jitter() -> int:
    return int(os.environ.get("DIFF_JITTER_MS", "25"))


def overhead_from(samples: list[float]) -> float:
    """B_T: twice the worst no-limit latency, plus 5 ms."""
    return 2 * max(samples) + 5


async def run_all(
    scenarios: list[Scenario], nginx_url: str, gateway_url: str, lead_s: float = 0.3
) -> tuple[dict[str, dict[str, list[Observed]]], dict[str, list[float]], float]:
    """Replay every scenario against both targets at once, from one common start.

    Returns the observations, the baseline latencies per target and the client loop's worst stall (ms).
    """
    async with new_session() as session:
        base = {"nginx": await baseline(session, nginx_url), "gateway": await baseline(session, gateway_url)}
        loop = asyncio.get_running_loop()
        start = loop.time() + lead_s
        jobs = []
        for scn in scenarios:
            for url in (nginx_url, gateway_url):
                jobs.append(replay(session, url, scn, start))
        done = asyncio.Event()
        ticker = asyncio.ensure_future(_loop_lag(done))
        try:
            results = await asyncio.gather(*jobs)
        finally:
            done.set()
            lag = await ticker
    out: dict[str, dict[str, list[Observed]]] = {}
    for k, scn in enumerate(scenarios):
        out[scn.name] = {"nginx": results[2 * k], "gateway": results[2 * k + 1]}
    return out, base, lag


async def _loop_lag(done: asyncio.Event, tick: float = 0.005) -> float:
    loop = asyncio.get_running_loop()
    worst = 0.0
    while not done.is_set():
        before = loop.time()
        await asyncio.sleep(tick)
        worst = max(worst, (loop.time() - before - tick) * 1000)
    return worst


def wait_for_logs(seconds: float = 0.4) -> None:
    time.sleep(seconds)  # the gateway flushes its access log every 100 ms


# -- one run of both targets --------------------------------------------------------------------

STAGGER_MS = 30  # scenario k starts k * 30 ms after the common start: bursts do not coincide


async def hold_request(request: web.Request) -> None:
    """Upstream hook: ``?hold=MS`` keeps the request (and its limit_conn slot) for MS ms."""
    ms = int(request.query.get("hold", "0") or 0)
    if ms:
        await asyncio.sleep(ms / 1000)


def run_and_compare(nginx: Nginx, gateway: Gateway, scenarios: list[Scenario], jitter: int, workdir: Path) -> Run:
    """Start both, run every scenario through each, and compare them request for request."""
    nginx.start()
    gateway.start()
    observed, base, loop_lag = asyncio.run(run_all(scenarios, nginx.url, gateway.url))
    wait_for_logs()
    overhead = {name: overhead_from(samples) for name, samples in base.items()}
    by_rid: dict[str, dict[str, Observed]] = {"nginx": {}, "gateway": {}}
    for scn in scenarios:
        for target in ("nginx", "gateway"):
            for i, obs in enumerate(observed[scn.name][target]):
                by_rid[target][rid(scn, i)] = obs
    attach_logs(by_rid["nginx"], nginx.access(), nginx.errors())
    attach_logs(by_rid["gateway"], gateway.access_json(wait=0), gateway.stderr())
    results = {}
    for scn in scenarios:
        both = observed[scn.name]["nginx"] + observed[scn.name]["gateway"]
        lateness = max(0, math.ceil(max(o.lateness_ms for o in both)))
        analysis = analyse(scn, (scn.jitter_ms or jitter) + lateness)
        results[scn.name] = compare(
            scn, analysis, observed[scn.name]["nginx"], observed[scn.name]["gateway"], overhead, loop_lag
        )
    report = "\n\n".join(c.report() for c in results.values())
    (workdir / "report.txt").write_text(report + "\n")
    return Run(results, nginx.errors(), gateway.stderr(), workdir)
