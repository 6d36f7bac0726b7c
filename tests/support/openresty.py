"""An OpenResty-style node for the interop tests: nginx + ngx_http_lua running our limit_req.lua.

The node behaves like an OpenResty server using lua-resty-redis-ratelimit (as described in
shared/reference/limit-semantics.md §5), written here from that description:

* ``rate`` strings ``"<N>r/s"`` / ``"<N>r/m"``: ``rate_m = floor(N*1000/scale)``; ``burst_m =
  burst*1000``; every number is sent with Lua's ``tostring`` (LuaJIT: ``%.14g``);
* ``now = ngx.now() * 1000`` (client clock, ms resolution);
* the script is loaded once per worker (``SCRIPT LOAD``) and called with
  ``EVALSHA <sha> 1 <zone>:<key> <rate_m> <burst_m> <now> <duration>``;
* on any EVALSHA error the cached sha is forgotten and the call fails (no retry in the same
  call): the next call loads the script again;
* the connection goes back to the keepalive pool (10 s, 100) after every call;
* an accepted request's delay is the library's ``excess / rate_m`` seconds (the reply's excess,
  an integer: Redis truncates a Lua number in a reply), and the wait is what ``ngx.sleep`` makes
  of it after the README's ``if delay >= 0.001``: ``(ngx_int_t) (seconds * 1000)`` ms.

Redis is spoken to through a tiny RESP client on ``ngx.socket.tcp`` (no lua-resty-redis).

``GET /limit?zone=Z&rate=2r/s&burst=2&duration=0[&key=K][&now=MS]`` runs the limiter on key K
(default ``$binary_remote_addr``) and answers 200 (state 1), 503 (state 2 or 3) or 500 (error),
with headers ``X-State``, ``X-Excess`` (the script's reply), ``X-Now`` (the ``now`` string sent),
``X-Sha`` (the cached sha after the call), ``X-Loads`` (SCRIPT LOADs done by this worker),
``X-Rate`` (rate_m), ``X-Delay`` (the delay in seconds, ``%.17g``), ``X-Sleep-Ms`` (the ms
``ngx.sleep`` waits for it) and ``X-Err``. ``now`` replaces the node's clock (``ngx.now() * 1000``)
for that call: tests drive the shared state by timestamps.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

import pytest

from tests.support.nginx import NginxProcess
from tests.support.paths import SCRIPTS
from tests.support.ports import free_port

MODULE_DIRS = ("/usr/lib/nginx/modules", "/usr/share/nginx/modules", "/usr/lib64/nginx/modules")
RESTY_CORE = "/usr/share/lua/5.1/resty/core.lua"


# zone -> (gateway zone settings, route path); every route: burst 2, nodelay
ZONES: dict[str, tuple[str, str]] = {
    "interop_shared": ("rate: 2r/s", "/shared/"),
    "interop_fmt": ("rate: 1r/m", "/fmt/"),
    "interop_ban_a": ("rate: 2r/s, ban: 3s", "/ban_a/"),
    "interop_ban_b": ("rate: 2r/s, ban: 3s", "/ban_b/"),
    "interop_argv": ("rate: 30r/m", "/argv/"),
    "interop_noscript": ("rate: 2r/s", "/noscript/"),
}


def script_path() -> Path:
    """limit_req.lua in the checkout's scripts/lua (the file OpenResty nodes load)."""
    return SCRIPTS / "lua" / "limit_req.lua"


def gateway_config(port: int, redis_port: int, upstream: str) -> str:
    zones = "\n".join(
        f"  {zone}: {{type: req, key: $binary_remote_addr, {settings}}}" for zone, (settings, _) in ZONES.items()
    )
    routes = "\n".join(
        f"  - location: {path}\n    upstream: app\n    limit_req: [{{zone: {zone}, burst: 2, nodelay: true}}]"
        for zone, (_, path) in ZONES.items()
    )
    return f"""
listen: 127.0.0.1:{port}
admin: {{listen: off}}
log: {{format: json}}
store:
  redis: {{url: "redis://127.0.0.1:{redis_port}/0", timeout: 500ms, on_error: deny, prefix: ""}}
zones:
{zones}
upstreams:
  app: {{servers: [{upstream}]}}
routes:
{routes}
"""


def find_openresty() -> tuple[str, Path]:
    """The nginx binary and the directory holding the ndk and lua modules; skip (or fail when
    CI is set) if any part is missing."""
    binary = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    problem = ""
    modules: Path | None = None
    if binary is None:
        problem = "nginx binary not found"
    else:
        for candidate in MODULE_DIRS:
            path = Path(candidate)
            if (path / "ngx_http_lua_module.so").is_file() and (path / "ndk_http_module.so").is_file():
                modules = path
                break
        if modules is None:
            problem = "the nginx Lua module (libnginx-mod-http-lua) is not installed"
        elif not Path(RESTY_CORE).is_file():
            problem = f"lua-resty-core is not installed ({RESTY_CORE} missing)"
    if problem or binary is None or modules is None:
        if os.environ.get("CI"):
            pytest.fail(f"{problem} (CI is set: the OpenResty interop tests must run)")
        pytest.skip(f"{problem}: OpenResty interop tests skipped")
    return binary, modules


# Placeholders: @@MODULES@@ @@DIR@@ @@PORT@@ @@REDIS_PORT@@ @@SCRIPT@@
NGINX_CONF = r"""
load_module @@MODULES@@/ndk_http_module.so;
load_module @@MODULES@@/ngx_http_lua_module.so;

daemon off;
master_process off;
worker_processes 1;
pid @@DIR@@/nginx.pid;
error_log @@DIR@@/error.log info;

events {
    worker_connections 256;
}

http {
    lua_package_path "/usr/share/lua/5.1/?.lua;;";
    client_body_temp_path @@DIR@@/client_body_temp;
    proxy_temp_path @@DIR@@/proxy_temp;
    fastcgi_temp_path @@DIR@@/fastcgi_temp;
    uwsgi_temp_path @@DIR@@/uwsgi_temp;
    scgi_temp_path @@DIR@@/scgi_temp;
    access_log @@DIR@@/access.log;

    init_by_lua_block {
        local M = {}
        local REDIS_HOST, REDIS_PORT = "127.0.0.1", @@REDIS_PORT@@

        local fh = assert(io.open("@@SCRIPT@@", "rb"))
        local SCRIPT = fh:read("*a")
        fh:close()

        local cached_sha = nil  -- one per worker, forgotten on any EVALSHA error
        local loads = 0

        -- RESP: a command is an array of bulk strings; non-strings go through tostring.
        local function encode(args)
            local out = { "*", tostring(#args), "\r\n" }
            for i = 1, #args do
                local a = args[i]
                if type(a) ~= "string" then
                    a = tostring(a)
                end
                out[#out + 1] = "$" .. #a .. "\r\n"
                out[#out + 1] = a
                out[#out + 1] = "\r\n"
            end
            return table.concat(out)
        end

        -- Returns value; or nil, message, is_error_reply.
        local function read_reply(sock)
            local line, err = sock:receive("*l")
            if not line then
                return nil, "redis receive failed: " .. tostring(err), false
            end
            local kind, rest = string.sub(line, 1, 1), string.sub(line, 2)
            if kind == "+" then
                return rest
            elseif kind == "-" then
                return nil, rest, true
            elseif kind == ":" then
                return tonumber(rest)
            elseif kind == "$" then
                local size = tonumber(rest)
                if size < 0 then
                    return ngx.null
                end
                local data, rerr = sock:receive(size + 2)
                if not data then
                    return nil, "redis receive failed: " .. tostring(rerr), false
                end
                return string.sub(data, 1, size)
            elseif kind == "*" then
                local count = tonumber(rest)
                if count < 0 then
                    return ngx.null
                end
                local items = {}
                for i = 1, count do
                    local v, verr, is_reply = read_reply(sock)
                    if v == nil then
                        if not is_reply then
                            return nil, verr, false
                        end
                        v = { err = verr }
                    end
                    items[i] = v
                end
                return items
            end
            return nil, "unexpected redis reply: " .. line, false
        end

        local function call(sock, args)
            local ok, err = sock:send(encode(args))
            if not ok then
                return nil, "redis send failed: " .. tostring(err), false
            end
            return read_reply(sock)
        end

        function M.new(zone, rate, burst, duration)
            rate = rate or "1r/s"
            local scale = 1
            if #rate > 3 then
                local unit = string.sub(rate, -3)
                if unit == "r/s" then
                    rate = string.sub(rate, 1, -4)
                elseif unit == "r/m" then
                    scale = 60
                    rate = string.sub(rate, 1, -4)
                end
            end
            local n = assert(tonumber(rate), "invalid rate")
            burst = burst or 0
            duration = duration or 0
            assert(n > 0 and burst >= 0 and duration >= 0)
            return {
                zone = zone or "ratelimit",
                rate_m = math.floor(n * 1000 / scale),
                burst_m = burst * 1000,
                duration = duration,
            }
        end

        -- state (1 OK, 2 BUSY, 3 FORBIDDEN), excess, now; or nil, err, now
        function M.incoming(lim, key, clock_ms)
            local sock = ngx.socket.tcp()
            sock:settimeout(1000)
            local ok, err = sock:connect(REDIS_HOST, REDIS_PORT)
            if not ok then
                return nil, "failed to create redis - " .. tostring(err)
            end
            if not cached_sha then
                local sha, lerr, is_reply = call(sock, { "SCRIPT", "LOAD", SCRIPT })
                if not sha then
                    if is_reply then
                        sock:setkeepalive(10000, 100)
                    else
                        sock:close()
                    end
                    return nil, lerr
                end
                cached_sha = sha
                loads = loads + 1
            end
            local now = clock_ms or ngx.now() * 1000
            local res, cerr, is_reply = call(sock, {
                "EVALSHA", cached_sha, 1, lim.zone .. ":" .. key,
                lim.rate_m, lim.burst_m, now, lim.duration,
            })
            if is_reply or res then
                sock:setkeepalive(10000, 100)
            else
                sock:close()
            end
            if not res then
                cached_sha = nil
                return nil, cerr, now
            end
            return res[1], res[2], now
        end

        function M.sha()
            return cached_sha
        end

        function M.loads()
            return loads
        end

        package.loaded.interop_ratelimit = M
    }

    server {
        listen 127.0.0.1:@@PORT@@;

        location = /limit {
            content_by_lua_block {
                local limiter = require "interop_ratelimit"
                local args = ngx.req.get_uri_args()
                local lim = limiter.new(args.zone, args.rate or "2r/s",
                                        tonumber(args.burst or "2"), tonumber(args.duration or "0"))
                local key = args.key or ngx.var.binary_remote_addr
                local state, excess, now = limiter.incoming(lim, key, tonumber(args.now or ""))
                ngx.header["X-Now"] = now and tostring(now) or ""
                ngx.header["X-Rate"] = tostring(lim.rate_m)
                ngx.header["X-Sha"] = limiter.sha() or ""
                ngx.header["X-Loads"] = tostring(limiter.loads())
                if not state then
                    ngx.header["X-Err"] = string.gsub(tostring(excess), "[\r\n]", " ")
                    ngx.status = 500
                    ngx.say("limiter error: ", excess)
                    return
                end
                ngx.header["X-State"] = tostring(state)
                ngx.header["X-Excess"] = tostring(excess)
                if state == 1 then
                    -- the library's incoming(): delay = excess / rate (seconds)
                    local delay = excess / lim.rate_m
                    ngx.header["X-Delay"] = string.format("%.17g", delay)
                    -- its README: if delay >= 0.001 then ngx.sleep(delay) end; ngx.sleep waits
                    -- (ngx_int_t) (delay * 1000) ms, a truncation
                    local sleep_ms = 0
                    if delay >= 0.001 then
                        sleep_ms = math.floor(delay * 1000)
                    end
                    ngx.header["X-Sleep-Ms"] = string.format("%d", sleep_ms)
                end
                ngx.status = state == 1 and 200 or 503
                ngx.say(state == 1 and "ok" or "rejected")
            }
        }
    }
}
"""


@dataclass
class Hit:
    """One request to either node, with the client clock (epoch ms) around it."""

    status: int
    t_before: float
    t_after: float
    headers: dict[str, str] = field(default_factory=dict)
    body: str = ""

    @property
    def state(self) -> int | None:
        value = self.headers.get("x-state")
        return int(value) if value else None

    @property
    def excess(self) -> int | None:
        value = self.headers.get("x-excess")
        return int(value) if value else None

    @property
    def sleep_ms(self) -> int | None:
        """The ms the node waits before serving an accepted request (None: not accepted)."""
        value = self.headers.get("x-sleep-ms")
        return int(value) if value else None

    @property
    def now(self) -> str:
        return self.headers.get("x-now", "")


def epoch_ms() -> float:
    return time.time() * 1000


def http_get(port: int, target: str, timeout: float = 5.0) -> Hit:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        t_before = epoch_ms()
        conn.request("GET", target, headers={"Connection": "close"})
        response = conn.getresponse()
        body = response.read().decode(errors="replace")
        t_after = epoch_ms()
        headers = {k.lower(): v for k, v in response.getheaders()}
        return Hit(response.status, t_before, t_after, headers, body)
    finally:
        conn.close()


class OpenResty(NginxProcess):
    """nginx with the Lua limiter, a child of the test run with everything in ``workdir``."""

    def __init__(self, binary: str, modules: Path, workdir: Path, redis_port: int, script: Path) -> None:
        port = free_port()
        text = NGINX_CONF
        for name, value in {
            "MODULES": str(modules),
            "DIR": str(workdir),
            "PORT": str(port),
            "REDIS_PORT": str(redis_port),
            "SCRIPT": str(script),
        }.items():
            text = text.replace(f"@@{name}@@", value)
        super().__init__(binary, workdir, text, port)

    def limit(
        self,
        zone: str,
        rate: str = "2r/s",
        burst: float = 2,
        duration: int = 0,
        key: str | None = None,
        now: int | None = None,
    ) -> Hit:
        query: dict[str, str] = {"zone": zone, "rate": rate, "burst": str(burst), "duration": str(duration)}
        if key is not None:
            query["key"] = key
        if now is not None:
            query["now"] = str(now)
        return http_get(self.port, "/limit?" + urlencode(query))


# -- MONITOR ---------------------------------------------------------------------------------------

_ESCAPES = {"n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b", '"': b'"', "\\": b"\\"}


def parse_monitor_line(line: str) -> tuple[str, list[bytes]]:
    """``1712345678.123456 [0 127.0.0.1:5000] "EVALSHA" "ab.." ...`` -> ("127.0.0.1:5000", args).

    Arguments are quoted as Redis' sdscatrepr writes them (\\xHH for other bytes)."""
    open_at = line.index("[")
    close_at = line.index("]", open_at)
    source = line[open_at + 1 : close_at].split(" ", 1)[1]
    rest = line[close_at + 1 :]
    args: list[bytes] = []
    i = 0
    while i < len(rest):
        if rest[i] != '"':
            i += 1
            continue
        i += 1
        out = bytearray()
        while rest[i] != '"':
            ch = rest[i]
            if ch == "\\":
                nxt = rest[i + 1]
                if nxt == "x":
                    out.append(int(rest[i + 2 : i + 4], 16))
                    i += 4
                    continue
                out += _ESCAPES[nxt]
                i += 2
                continue
            out += ch.encode("latin-1")
            i += 1
        args.append(bytes(out))
        i += 1
    return source, args


class Monitor:
    """A raw connection in MONITOR mode collecting every command Redis executes."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.sendall(b"*1\r\n$7\r\nMONITOR\r\n")
        self.stream = self.sock.makefile("rb")
        first = self.stream.readline()
        if first != b"+OK\r\n":
            raise RuntimeError(f"MONITOR answered {first!r}")
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, name="redis-monitor", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        self.sock.settimeout(None)
        while True:
            try:
                raw = self.stream.readline()
            except (OSError, ValueError):
                return
            if not raw:
                return
            with self._lock:
                self.lines.append(raw.decode("latin-1").rstrip("\r\n").lstrip("+"))

    def commands(self) -> list[tuple[str, list[bytes]]]:
        with self._lock:
            lines = list(self.lines)
        return [parse_monitor_line(line) for line in lines]

    def wait_for(self, predicate: object, timeout: float = 2.0) -> list[tuple[str, list[bytes]]]:
        """Wait until some captured command satisfies ``predicate(source, args)``."""
        assert callable(predicate)
        deadline = time.monotonic() + timeout
        while True:
            cmds = self.commands()
            if any(predicate(src, args) for src, args in cmds):
                return cmds
            if time.monotonic() > deadline:
                raise AssertionError(f"MONITOR did not show the command; saw {cmds!r}")
            time.sleep(0.01)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.stream.close()
        self.sock.close()
        self._thread.join(2)
