"""Throughput of the gateway beside its peers, measured side by side with wrk in one run.

    .venv/bin/python scripts/bench.py [--rounds 3] [--duration 4] [--connections 50]
                                      [--targets a,b,...] [--peer DIR] [--open-loop RATE]

Pinning (with two or more CPUs): the proxy under test has CPU 0 to itself; the upstream
(nginx `return 200`, or an aiohttp app without nginx), wrk and every redis-server share the
other CPUs. Rounds alternate between targets so that noise on a shared machine hits them
alike; the script prints each round, then each target's median requests/s and the ratios
that matter. Every Redis-backed target gets a redis-server of its own, so its counters are
its own: per request served, script calls (EVAL/EVALSHA/FCALL), all commands (as
INFO commandstats counts them, commands inside scripts included) and Redis CPU (user + sys,
from INFO cpu), summed over that target's wrk runs. For each target the proxy's own CPU per
request is read from /proc (the process tree; for `workers: 2` the master's share apart).

Targets (one entry each in TARGETS below; adding a target is adding an entry):
  nginx              nginx proxy + limit_req + limit_conn (C, shared memory)
  openresty          nginx + ngx_lua + lua-resty-redis-ratelimit: limit_req on Redis. Needs the
                     peer's Lua libraries unpacked outside the repository, in --peer DIR (or env
                     PEER, default ~/.cache/peer): DIR/timebug+lua-resty-redis-ratelimit/lib and
                     DIR/openresty+lua-resty-redis/lib; skipped (with a note) when absent
  baseline           scripts/baseline_proxy.py: bare aiohttp + uvloop, no limits
  gateway            the gateway, one worker, no limits (routing only, access log off)
  gateway+log        the same with the access log on (combined format, to /dev/null)
  gateway+req        one limit_req zone that never rejects, embedded store, workers: 1
  gateway+req-w2     the same with workers: 2 (pinned to all CPUs: "workers: 2 on 2 cores")
  gateway+redis      limit_req on Redis (the same work as openresty)
  gateway+redis+conn limit_req + limit_conn on Redis
  gateway+bans       "gateway" with 100,000 manual bans loaded through the admin API
  gateway+2000       "gateway" with 2,000 locations (1,500 prefix, 500 regex) before "/": /bench is a
                     prefix hit on "/" that no regex matches, so nginx's order tries every regex

    .venv/bin/python scripts/bench.py --rounds 3                  # the compare.sh set
    .venv/bin/python scripts/bench.py --targets gateway+req,gateway+req-w2
    .venv/bin/python scripts/bench.py --targets baseline,gateway --open-loop 0.5   # + p99, see openloop.py

--python-b PY adds, for each baseline or gateway target named with the suffix ``@B``
(``baseline@B``, ``gateway+redis@B``), the same target run on that other interpreter (a venv's
python with this project installed), in the same rounds, and prints each one against its
twin on this interpreter:

    .venv/bin/python scripts/bench.py --python-b /tmp/venv-deb/bin/python --rounds 5 \
        --targets baseline,baseline@B,gateway+redis,gateway+redis@B

--tree-b DIR runs the ``@B`` targets from another checkout instead (its ``gateway`` package;
on this interpreter unless --python-b says otherwise): an A/B of two trees in the same rounds,

    git worktree add /tmp/before HEAD~1
    .venv/bin/python scripts/bench.py --tree-b /tmp/before --rounds 5 \
        --targets gateway+redis,gateway+redis@B

--open-loop RATE (requests/s, or a fraction <= 1 of the target's measured median) then runs
scripts/openloop.py's fixed-rate generator against --open-loop-target (default `gateway`) and
the bare upstream at that rate, and prints p50/p90/p99/p99.9 added latency (target minus
upstream, each request timed from its scheduled send).
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import platform
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
ON_B = "@B"  # a target name's suffix: run on --python-b and from --tree-b
PYTHON_B = [""]
TREE_B = [ROOT]  # --tree-b: the checkout whose gateway package targets named <target>@B import


def python_for(name: str) -> str:
    """The interpreter a baseline or gateway target runs on."""
    return (PYTHON_B[0] or PY) if name.endswith(ON_B) else PY


def tree_for(name: str) -> Path:
    """The checkout a gateway target runs from (``python -m gateway`` imports its package)."""
    return TREE_B[0] if name.endswith(ON_B) else ROOT


NCPU = os.cpu_count() or 1
PROXY_CPU = "0"
LOAD_CPU = f"1-{NCPU - 1}" if NCPU > 2 else "1"
ALL_CPUS = f"0-{NCPU - 1}"
BAN_TOKEN = "bench-token-0123456789"
REDIS_TIMEOUT = [""]  # --redis-timeout: every Redis-backed gateway's store timeout ("" = its default)
DEFAULT_TARGETS = "nginx,openresty,baseline,gateway,gateway+redis,gateway+redis+conn"
SCRIPT_CMDS = ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro")
# Commands a measurement itself sends, left out of the per-request counts.
OWN_CMDS = ("info", "config", "ping", "client")
# Ratios printed under the table when both sides ran: (numerator, denominator).
RATIOS = (
    ("gateway", "baseline"),
    ("gateway+redis+conn", "baseline"),
    ("gateway+redis", "openresty"),
    ("gateway+redis+conn", "openresty"),
    ("gateway", "nginx"),
    ("gateway+req-w2", "gateway+req"),
)


# -- processes ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listening on {port}")


def pin(cpus: str) -> list[str]:
    return ["taskset", "-c", cpus] if shutil.which("taskset") and NCPU > 1 else []


def nginx_binary() -> str | None:
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


def nginx_head(tmp: Path, name: str) -> str:
    """The common top of a throw-away nginx config in ``tmp/name``."""
    d = tmp / name
    d.mkdir(exist_ok=True)
    user = "user root;\n" if os.geteuid() == 0 else ""  # the peer's Lua files may sit in /root
    return (
        f"{user}worker_processes 1; daemon off; pid {d}/nginx.pid; error_log {d}/error.log warn;\n"
        "events { worker_connections 4096; }\n"
        f"http {{ access_log off; client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d};\n"
        f"  uwsgi_temp_path {d}; scgi_temp_path {d};\n"
    )


@dataclass
class Redis:
    proc: subprocess.Popen[bytes] | None
    port: int

    def info(self, section: str) -> str:
        with socket.create_connection(("127.0.0.1", self.port), 5) as s:
            s.sendall(f"INFO {section}\r\n".encode())
            data = b""
            while b"\r\n" not in data:
                data += s.recv(65536)
            size = int(data[1 : data.index(b"\r\n")])
            start = data.index(b"\r\n") + 2
            while len(data) < start + size:
                data += s.recv(65536)
            return data[start : start + size].decode()

    def snapshot(self) -> RedisSnapshot:
        return redis_snapshot(self.info("commandstats"), self.info("cpu"))


@dataclass(frozen=True)
class RedisSnapshot:
    script_calls: int
    commands: int
    cpu_seconds: float


def parse_info(text: str) -> dict[str, str]:
    """``INFO`` text as ``{field: value}`` (section headers and blank lines skipped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and ":" in line:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def redis_snapshot(commandstats: str, cpu: str) -> RedisSnapshot:
    """Totals from ``INFO commandstats`` and ``INFO cpu``: script calls, all commands but the
    measurement's own (OWN_CMDS), and Redis' CPU time (user + sys, main thread and children)."""
    calls = scripts = 0
    for key, value in parse_info(commandstats).items():
        if not key.startswith("cmdstat_"):
            continue
        name = key.removeprefix("cmdstat_").split("|")[0]
        fields = dict(part.split("=", 1) for part in value.split(","))
        n = int(fields["calls"])
        if name in SCRIPT_CMDS:
            scripts += n
        if name not in OWN_CMDS:
            calls += n
    c = parse_info(cpu)
    seconds = float(c.get("used_cpu_user", 0)) + float(c.get("used_cpu_sys", 0))
    return RedisSnapshot(scripts, calls, seconds)


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of one process, in seconds (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def tree(pid: int) -> list[int]:
    out = [pid]
    for child in children(pid):
        out += tree(child)
    return out


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Lab:
    """Owns a temporary directory and every process started in it; stops them all on exit."""

    def __init__(self, peer: Path | None = None) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="bench-")
        self.tmp = Path(self._dir.name)
        self.peer = peer
        self.procs: list[subprocess.Popen[bytes]] = []
        self.upstream_port = 0
        self.upstream_kind = ""

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._dir.cleanup()

    def spawn(self, cmd: list[str], cpus: str, log: Path | None = None, cwd: Path = ROOT) -> subprocess.Popen[bytes]:
        out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen(pin(cpus) + cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT if log else None)
        if log:
            out.close()  # type: ignore[union-attr]
        self.procs.append(proc)
        return proc

    def upstream(self) -> int:
        """The fast upstream every target proxies to (started once, on the load CPUs)."""
        if self.upstream_port:
            return self.upstream_port
        port = free_port()
        if nginx := nginx_binary():
            conf = self.tmp / "upstream.conf"
            conf.write_text(
                nginx_head(self.tmp, "upstream")
                + f"  server {{ listen 127.0.0.1:{port} backlog=4096; keepalive_requests 1000000;\n"
                + '    location / { return 200 "ok\\n"; } } }\n'
            )
            self.spawn([nginx, "-c", str(conf), "-e", "stderr"], LOAD_CPU)
            self.upstream_kind = "nginx return 200"
        else:
            code = (
                "import sys,uvloop;from aiohttp import web;app=web.Application();"
                "app.router.add_get('/{t:.*}',lambda r: web.Response(text='ok\\n'));"
                "web.run_app(app,port=int(sys.argv[1]),access_log=None,print=None,loop=uvloop.new_event_loop())"
            )
            self.spawn([PY, "-c", code, str(port)], LOAD_CPU)
            self.upstream_kind = "aiohttp hello"
        wait_port(port)
        self.upstream_port = port
        return port

    def redis(self) -> Redis:
        """A redis-server of its own (no persistence) on the load CPUs."""
        port = free_port()
        d = self.tmp / f"redis-{port}"
        d.mkdir()
        cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        proc = self.spawn(cmd + ["--dir", str(d)], LOAD_CPU)
        wait_port(port)
        return Redis(proc, port)


# -- targets -----------------------------------------------------------------------------------


@dataclass
class Running:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    path: str
    redis: Redis | None = None
    error_log: Path | None = None
    workers: int = 1

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    def circuit_openings(self) -> int:
        return count_circuit_openings(self.error_log)


def count_circuit_openings(error_log: Path | None) -> int:
    """Lines of the gateway's error log that say the Redis circuit opened."""
    if error_log is None or not error_log.exists():
        return 0
    return sum(1 for line in error_log.read_text(errors="replace").splitlines() if "circuit open" in line.lower())


@dataclass(frozen=True)
class Gw:
    """A gateway configuration: which limits, on which store, how many workers."""

    req: bool = False
    conn: bool = False
    count: bool = False
    redis: bool = False
    log: bool = False
    workers: int = 1
    admin: bool = False
    key: str = "$binary_remote_addr"
    redis_timeout: str = ""  # "" = the gateway's default, as compare.sh runs it
    extra_routes: str = ""  # YAML route items ("  - location: ...") placed before the catch-all "/"

    def config(self, port: int, upstream: int, redis_port: int, admin_port: int, error_log: Path) -> str:
        admin = f"{{listen: 127.0.0.1:{admin_port}, token: {BAN_TOKEN}}}" if admin_port else "{listen: off}"
        access = "/dev/null" if self.log else "off"
        text = (
            f"listen: 127.0.0.1:{port}\nworkers: {self.workers}\nadmin: {admin}\n"
            f"log: {{access: {access}, format: combined, error: {error_log}, level: notice}}\n"
            f"upstreams:\n  app: {{servers: [127.0.0.1:{upstream}], keepalive: 64}}\n"
        )
        if self.redis:
            chosen = self.redis_timeout or REDIS_TIMEOUT[0]
            timeout = f", timeout: {chosen}" if chosen else ""
            text += f'store:\n  redis: {{url: "redis://127.0.0.1:{redis_port}/0"{timeout}}}\n'
        zones = []
        if self.req:
            zones.append(f"  ip: {{type: req, key: {self.key}, rate: 1000000r/s}}")
        if self.count:
            zones.append(f"  quota: {{type: count, key: {self.key}, limit: 1000000000, window: 60s}}")
        if self.conn:
            zones.append(f"  conns: {{type: conn, key: {self.key}}}")
        if zones:
            text += "zones:\n" + "\n".join(zones) + "\n"
        text += "routes:\n" + self.extra_routes + "  - location: /\n    upstream: app\n"
        if self.req:
            text += "    limit_req: [{zone: ip, burst: 1000000, nodelay: true}]\n"
        if self.count:
            text += "    limit_count: [{zone: quota}]\n"
        if self.conn:
            text += "    limit_conn: [{zone: conns, max: 65535}]\n"
        return text


Launch = Callable[["Lab", str], Running]


@dataclass(frozen=True)
class Target:
    about: str
    launch: Launch
    missing: Callable[[Lab], str] = lambda lab: ""  # why it cannot run here ("" = it can)
    gw: Gw | None = None  # a gateway target's configuration (bench_instructions.py starts it under valgrind)


def start_gateway(lab: Lab, name: str, gw: Gw, cpus: str = PROXY_CPU) -> Running:
    port = free_port()
    redis = lab.redis() if gw.redis else None
    admin_port = free_port() if gw.admin else 0
    error_log = lab.tmp / f"{name}.error.log"
    conf = lab.tmp / f"{name}.yaml"
    conf.write_text(gw.config(port, lab.upstream(), redis.port if redis else 0, admin_port, error_log))
    cmd = [python_for(name), "-m", "gateway", "run", "-c", str(conf)]
    proc = lab.spawn(cmd, cpus, lab.tmp / f"{name}.out", cwd=tree_for(name))
    try:
        wait_port(port)
    except SystemExit:
        sys.stderr.write((lab.tmp / f"{name}.out").read_text(errors="replace")[-3000:])
        raise
    return Running(name, proc, port, "/bench", redis, error_log, gw.workers)


def gateway(about: str, gw: Gw, cpus: str = PROXY_CPU, after: Callable[[Lab, Running], None] | None = None) -> Target:
    def launch(lab: Lab, name: str) -> Running:
        run = start_gateway(lab, name, gw, cpus)
        if after:
            after(lab, run)
        return run

    return Target(about, launch, gw=gw)


def start_baseline(lab: Lab, name: str) -> Running:
    port = free_port()
    cmd = [python_for(name), str(ROOT / "scripts" / "baseline_proxy.py"), str(port), f"127.0.0.1:{lab.upstream()}"]
    proc = lab.spawn(cmd, PROXY_CPU)
    wait_port(port)
    return Running(name, proc, port, "/bench")


def start_nginx(lab: Lab, name: str) -> Running:
    port, nginx = free_port(), nginx_binary()
    assert nginx
    conf = lab.tmp / f"{name}.conf"
    conf.write_text(
        nginx_head(lab.tmp, name)
        # burst as large as the gateway targets': nginx reads its clock once per event-loop pass, so
        # at 100k req/s one pass can hold more than 100 requests of the same millisecond
        + "  limit_req_zone $binary_remote_addr zone=ip:10m rate=1000000r/s;\n"
        + "  limit_conn_zone $binary_remote_addr zone=c:10m;\n"
        + f"  upstream app {{ server 127.0.0.1:{lab.upstream()}; keepalive 64; }}\n"
        + f"  server {{ listen 127.0.0.1:{port} backlog=4096; keepalive_requests 1000000;\n"
        + "    location / { limit_req zone=ip burst=1000000 nodelay; limit_conn c 60000; proxy_http_version 1.1;\n"
        + '      proxy_set_header Connection ""; proxy_pass http://app; } } }\n'
    )
    proc = lab.spawn([nginx, "-c", str(conf), "-e", "stderr"], PROXY_CPU)
    wait_port(port)
    return Running(name, proc, port, "/")


PEER_LIBS = ("timebug+lua-resty-redis-ratelimit", "openresty+lua-resty-redis")
LUA_MODULES = ("/usr/lib/nginx/modules", "/usr/share/nginx/modules", "/usr/lib64/nginx/modules")


def lua_modules() -> Path | None:
    for d in map(Path, LUA_MODULES):
        if (d / "ngx_http_lua_module.so").is_file() and (d / "ndk_http_module.so").is_file():
            return d
    return None


def peer_missing(lab: Lab) -> str:
    if not nginx_binary():
        return "nginx is not installed"
    if lua_modules() is None:
        return "the nginx Lua module is not installed (apt-get install libnginx-mod-http-lua lua-resty-core)"
    if lab.peer is None or not all((lab.peer / lib / "lib").is_dir() for lib in PEER_LIBS):
        return f"the peer's Lua libraries are not in {lab.peer}/{{{','.join(PEER_LIBS)}}}/lib (see --peer)"
    return ""


def start_openresty(lab: Lab, name: str) -> Running:
    """nginx + ngx_lua running lua-resty-redis-ratelimit as its README shows: one limiter per
    request, key = $binary_remote_addr, the Redis connection kept alive by the library."""
    port, nginx, modules, peer = free_port(), nginx_binary(), lua_modules(), lab.peer
    assert nginx and modules and peer
    redis = lab.redis()
    path = ";".join(f"{peer}/{lib}/lib/?.lua" for lib in PEER_LIBS) + ";/usr/share/lua/5.1/?.lua;;"
    conf = lab.tmp / f"{name}.conf"
    conf.write_text(
        f"load_module {modules}/ndk_http_module.so;\nload_module {modules}/ngx_http_lua_module.so;\n"
        + nginx_head(lab.tmp, name)
        + f'  lua_package_path "{path}";\n'
        + f"  upstream app {{ server 127.0.0.1:{lab.upstream()}; keepalive 64; }}\n"
        + f"  server {{ listen 127.0.0.1:{port} backlog=4096; keepalive_requests 1000000;\n"
        + "    location / {\n      access_by_lua_block {\n"
        + '        local lim = require("resty.redis.ratelimit").new("bench", "1000000r/s", 1000000, 0)\n'
        + "        local delay, err = lim:incoming(ngx.var.binary_remote_addr,"
        + f' {{host = "127.0.0.1", port = {redis.port}, timeout = 1}})\n'
        + '        if not delay then return ngx.exit(err == "rejected" and 503 or 500) end\n'
        + "      }\n"
        + '      proxy_http_version 1.1; proxy_set_header Connection ""; proxy_pass http://app; } } }\n'
    )
    proc = lab.spawn([nginx, "-c", str(conf), "-e", "stderr"], PROXY_CPU)
    wait_port(port)
    return Running(name, proc, port, "/", redis)


def blocklist(path: Path, count: int = 100_000) -> Path:
    """``count`` distinct CIDRs, none covering 127.0.0.0/8 (wrk's address)."""
    rng = random.Random(13)
    kinds = ((32, 40), (24, 20), (16, 5), (128, 20), (64, 15))  # prefix length, share in %
    out: dict[str, None] = {}
    for plen, share in kinds:
        goal = len(out) + count * share // 100
        while len(out) < goal:
            if plen <= 32:
                first = rng.choice([n for n in range(11, 224) if n != 127])
                value = ((first << 24) | rng.getrandbits(24)) >> (32 - plen) << (32 - plen)
                out[f"{ipaddress.IPv4Address(value)}/{plen}"] = None
            else:
                value = ((0x20010DB8 << 96) | rng.getrandbits(96)) >> (128 - plen) << (128 - plen)
                out[f"{ipaddress.IPv6Address(value)}/{plen}"] = None
    path.write_text("\n".join(out) + "\n")
    return path


def load_bans(lab: Lab, run: Running) -> None:
    started = time.monotonic()
    conf = lab.tmp / f"{run.name}.yaml"
    bans = blocklist(lab.tmp / "blocklist.txt")
    cmd = [PY, "-m", "gateway", "ban", "--file", str(bans), "--for", "0", "-c", str(conf)]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    print(f"{run.name}: 100,000 bans loaded in {time.monotonic() - started:.1f} s", flush=True)


def no_nginx(lab: Lab) -> str:
    return "" if nginx_binary() else "nginx is not installed"


def large_routes(prefixes: int = 1500, regexes: int = 500) -> str:
    """The gateway+2000 target's locations: every third prefix is ``^~``; half the regexes are
    case-insensitive and anchored at the start, half anchored at the end. None matches /bench,
    which falls to ``location /``, so nginx's order tries every regex on each request."""
    lines = []
    for i in range(prefixes):
        lines.append(f"  - {{location: '{'^~ ' if i % 3 == 0 else ''}/svc{i}/', upstream: app}}")
    for i in range(regexes):
        regex = f"~* ^/static/file{i}\\." if i % 2 else f"~ \\.e{i}$"
        lines.append(f"  - {{location: '{regex}', upstream: app}}")
    return "\n".join(lines) + "\n"


TARGETS: dict[str, Target] = {
    "nginx": Target("nginx proxy + limit_req + limit_conn", start_nginx, no_nginx),
    "openresty": Target(
        "nginx + ngx_lua + lua-resty-redis-ratelimit, limit_req on Redis", start_openresty, peer_missing
    ),
    "baseline": Target("bare aiohttp + uvloop proxy, no limits", start_baseline),
    "gateway": gateway("gateway, no limits", Gw()),
    "gateway+log": gateway("gateway, access log on", Gw(log=True)),
    "gateway+req": gateway("gateway, limit_req, embedded store, workers: 1", Gw(req=True)),
    "gateway+req-w2": gateway("gateway, limit_req, embedded store, workers: 2", Gw(req=True, workers=2), ALL_CPUS),
    "gateway+redis": gateway("gateway, limit_req on Redis", Gw(req=True, redis=True)),
    "gateway+redis+conn": gateway("gateway, limit_req + limit_conn on Redis", Gw(req=True, conn=True, redis=True)),
    "gateway+bans": gateway("gateway, 100,000 manual bans", Gw(admin=True), after=load_bans),
    "gateway+2000": gateway("gateway, 2,000 locations (1,500 prefix, 500 regex)", Gw(extra_routes=large_routes())),
}


# -- measuring ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class WrkResult:
    rps: float
    requests: int


def parse_wrk(out: str) -> WrkResult:
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    count = re.search(r"(\d+) requests in", out)
    if not rate or not count:
        raise SystemExit(f"cannot read wrk's output:\n{out}")
    return WrkResult(float(rate.group(1)), int(count.group(1)))


def wrk(url: str, duration: float, connections: int, script: Path | None = None) -> WrkResult:
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{duration:g}s"] + (["-s", str(script)] if script else []) + [url]
    out = subprocess.run(pin(LOAD_CPU) + cmd, capture_output=True, text=True, check=True).stdout
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise SystemExit(f"wrk saw {errors.group(1)} error responses from {url}:\n{out}")
    return parse_wrk(out)


@dataclass
class Tally:
    """One target's figures over all its measured runs."""

    rps: list[float] = field(default_factory=list)
    requests: int = 0
    proxy_cpu: float = 0.0
    master_cpu: float = 0.0
    redis_scripts: int = 0
    redis_commands: int = 0
    redis_cpu: float = 0.0

    def per_request(self, value: float) -> float:
        return value / self.requests if self.requests else 0.0


def measure(run: Running, tally: Tally, duration: float, connections: int) -> float:
    pids = tree(run.proc.pid)
    cpu0 = [proc_cpu_seconds(p) for p in pids]
    before = run.redis.snapshot() if run.redis else None
    result = wrk(run.url, duration, connections)
    cpu1 = [proc_cpu_seconds(p) for p in pids]
    tally.rps.append(result.rps)
    tally.requests += result.requests
    tally.proxy_cpu += sum(cpu1) - sum(cpu0)
    if run.workers > 1:
        tally.master_cpu += cpu1[0] - cpu0[0]
    if run.redis and before:
        after = run.redis.snapshot()
        tally.redis_scripts += after.script_calls - before.script_calls
        tally.redis_commands += after.commands - before.commands
        tally.redis_cpu += after.cpu_seconds - before.cpu_seconds
    return result.rps


def add_twin_b(name: str) -> None:
    """Enter ``name`` (``<target>@B``) in TARGETS: ``<target>`` on --python-b, from --tree-b."""
    base = TARGETS.get(name.removesuffix(ON_B))
    if base is None or not (base.gw or base.launch is start_baseline):
        raise SystemExit(f"{name}: only baseline and gateway targets have a twin on --python-b / --tree-b")
    if not PYTHON_B[0] and TREE_B[0] == ROOT:
        raise SystemExit(f"{name} needs --python-b or --tree-b")
    where = [f"on {PYTHON_B[0]}"] if PYTHON_B[0] else []
    where += [f"from {TREE_B[0]}"] if TREE_B[0] != ROOT else []
    TARGETS[name] = dataclasses.replace(base, about=f"{base.about}, {', '.join(where)}")


def check_targets(names: list[str], lab: Lab) -> list[str]:
    for name in names:
        if name.endswith(ON_B):
            add_twin_b(name)
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        raise SystemExit(f"unknown targets {unknown}; known: {', '.join(TARGETS)}")
    kept = []
    for name in names:
        why = TARGETS[name].missing(lab)
        if why:
            print(f"skipping {name}: {why}", flush=True)
        else:
            kept.append(name)
    return kept


def report(names: list[str], tallies: dict[str, Tally], runs: dict[str, Running]) -> None:
    med = {n: statistics.median(tallies[n].rps) for n in names}
    base = med.get("baseline", med[names[0]])
    base_name = "baseline" if "baseline" in med else names[0]
    print(f"\n| target | median req/s | ratio to {base_name} | proxy CPU µs/req | what |")
    print("|---|---|---|---|---|")
    for n in names:
        t = tallies[n]
        cpu = f"{t.per_request(t.proxy_cpu) * 1e6:.0f}"
        if runs[n].workers > 1:
            cpu += f" (master {t.per_request(t.master_cpu) * 1e6:.1f})"
        print(f"| {n} | {med[n]:,.0f} | {med[n] / base:.2f} | {cpu} | {TARGETS[n].about} |")
    pairs = [*RATIOS, *((n, n.removesuffix(ON_B)) for n in names if n.endswith(ON_B))]
    lines = [f"  {a} / {b} = {med[a] / med[b]:.3f}" for a, b in pairs if a in med and b in med]
    if lines:
        print("\nratios:\n" + "\n".join(lines))
    redis = [n for n in names if runs[n].redis]
    if redis:
        print("\nRedis cost per request served (a redis-server per target; INFO commandstats and INFO cpu):")
        print("| target | script calls/req | commands/req | Redis CPU µs/req | circuit openings |")
        print("|---|---|---|---|---|")
        for n in redis:
            t = tallies[n]
            print(
                f"| {n} | {t.per_request(t.redis_scripts):.2f} | {t.per_request(t.redis_commands):.1f} "
                f"| {t.per_request(t.redis_cpu) * 1e6:.1f} | {runs[n].circuit_openings()} |"
            )
    opened = {n: runs[n].circuit_openings() for n in names if runs[n].error_log}
    if any(opened.values()):
        print(f"\nwarning: the Redis circuit opened during the run: {opened}")


def default_peer() -> Path:
    return Path(os.environ.get("PEER") or Path.home() / ".cache" / "peer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=4, help="seconds per wrk run (default 4)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=50, help="wrk -c (default 50, as compare.sh)")
    parser.add_argument("--targets", default=DEFAULT_TARGETS, help=f"comma-separated, of: {', '.join(TARGETS)}")
    parser.add_argument("--peer", type=Path, default=default_peer(), help="the peer's Lua libraries (env PEER)")
    parser.add_argument(
        "--redis-timeout", default="", help="the gateways' Redis timeout, e.g. 1s on a busy machine (default: 50ms)"
    )
    parser.add_argument("--python-b", default="", metavar="PY", help="the interpreter of targets named <target>@B")
    parser.add_argument(
        "--tree-b", type=Path, default=ROOT, metavar="DIR", help="the checkout targets named <target>@B run from"
    )
    parser.add_argument("--open-loop", type=float, default=0, metavar="RATE", help="see scripts/openloop.py")
    parser.add_argument("--open-loop-seconds", type=float, default=10)
    parser.add_argument("--open-loop-target", default="gateway", help="the target measured open-loop (default gateway)")
    args = parser.parse_args()
    REDIS_TIMEOUT[0] = args.redis_timeout
    PYTHON_B[0] = args.python_b
    TREE_B[0] = args.tree_b.resolve()
    if not (TREE_B[0] / "gateway" / "__main__.py").is_file():
        raise SystemExit(f"--tree-b {args.tree_b}: no gateway package there")
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    with Lab(args.peer) as lab:
        names = check_targets(args.targets.split(","), lab)
        lab.upstream()
        runs = {name: TARGETS[name].launch(lab, name) for name in names}
        for run in runs.values():
            wrk(run.url, 1, args.connections)  # warm-up
        tallies = {n: Tally() for n in names}
        print(
            f"upstream: {lab.upstream_kind}; wrk -t1 -c{args.connections} -d{args.duration:g}s; cpus: {NCPU}; "
            f"proxy on CPU {PROXY_CPU}, upstream + wrk + Redis on CPU {LOAD_CPU}\n"
            f"python: {PY} ({platform.python_version()}); the interpreter's build moves every Python target "
            "(--python-b compares two)",
            flush=True,
        )
        for rnd in range(args.rounds):
            row = [f"{n} {measure(runs[n], tallies[n], args.duration, args.connections):,.0f}" for n in names]
            print(f"round {rnd + 1}: " + " | ".join(row), flush=True)
        report(names, tallies, runs)
        if args.open_loop:
            import openloop

            name = args.open_loop_target
            target = runs.get(name) or TARGETS[name].launch(lab, name)
            peak = statistics.median(tallies[name].rps) if name in tallies else 0.0
            rate = args.open_loop * peak if args.open_loop <= 1 else args.open_loop
            if rate <= 0:
                raise SystemExit(f"--open-loop as a fraction needs {name} in --targets")
            print(f"\nopen-loop target: {name}")
            openloop.compare(target.url, f"http://127.0.0.1:{lab.upstream()}/bench", rate, args.open_loop_seconds)


if __name__ == "__main__":
    main()
