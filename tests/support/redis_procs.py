"""Real Redis processes for tests: a standalone server, a cluster and a Sentinel set.

Every process here is a child ``redis-server`` started by the test run on its own
free loopback port (never the machine's Redis on 6379), so a test may kill,
pause and restart it. Nothing is daemonized: the children are ``Popen`` objects
that this module stops at teardown, and also

* at interpreter exit (``atexit``), for anything a test forgot, and
* when the pytest process itself dies (``setpriv --pdeathsig KILL``, applied when
  a process is started from the main thread; pytest runs fixtures there).

Talking to the processes uses a tiny RESP client over a raw socket (``command``)
so that the helpers need no redis-py client objects to close.

Public API (see the report / docstrings for details):

* ``free_port`` (from tests/support/ports.py); ``command(port, *args)``; ``pipeline(port, *cmds)``;
  ``info(port)``;
  ``wait_until(fn, timeout, what=...)``; ``require_redis_binaries()``.
* ``RedisServer``: one process; ``start/stop/kill/restart/pause/resume/close``.
* ``RedisCluster``: N masters (+ replicas) made with ``redis-cli --cluster create``.
* ``RedisSentinelSet``: master + replica(s) + 1 or 3 sentinels; planned and
  unplanned failover helpers.
* The fixtures that use them are in tests/conftest.py: ``redis_session``, ``redis_server``,
  ``redis_server_factory``, ``redis_cluster`` and ``redis_sentinel``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.support.ports import HOST, free_port

CLUSTER_SLOTS = 16384

T = TypeVar("T")


# --------------------------------------------------------------------------- errors


class RedisReplyError(Exception):
    """An error reply (``-ERR ...``) from a Redis server."""


class RedisStartError(RuntimeError):
    """A redis-server did not come up; the message carries the tail of its log."""


class NotReady(Exception):
    """Raised by a ``wait_until`` predicate to say why it is not ready yet."""


# --------------------------------------------------------------------------- binaries


def redis_server_bin() -> str | None:
    return shutil.which("redis-server")


def redis_cli_bin() -> str | None:
    return shutil.which("redis-cli")


def require_redis_binaries() -> None:
    """Skip the test if redis-server/redis-cli are missing; fail instead when $CI is set."""
    missing = [name for name in ("redis-server", "redis-cli") if shutil.which(name) is None]
    if not missing:
        return
    msg = f"{' and '.join(missing)} not found on PATH"
    if os.environ.get("CI"):
        pytest.fail(f"{msg} (CI is set, so this is an error, not a skip)")
    pytest.skip(msg)


# --------------------------------------------------------------------------- RESP


def _encode(args: Sequence[Any]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, (int, float)):
            data = str(arg).encode()
        else:
            raise TypeError(f"cannot send {type(arg).__name__} to Redis")
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def _read_reply(stream: Any) -> Any:
    line: bytes = stream.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError(f"connection closed mid-reply ({line!r})")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RedisReplyError(rest.decode(errors="replace"))
    if kind == b":":
        return int(rest)
    if kind == b"$":
        size = int(rest)
        if size < 0:
            return None
        data: bytes = stream.read(size + 2)
        if len(data) != size + 2:
            raise ConnectionError("connection closed mid-reply")
        return data[:-2].decode(errors="replace")
    if kind == b"*":
        count = int(rest)
        if count < 0:
            return None
        return [_read_reply(stream) for _ in range(count)]
    raise ConnectionError(f"unexpected RESP2 line {line!r}")


def command(port: int, *args: Any, host: str = HOST, timeout: float = 2.0) -> Any:
    """Send one command on a fresh connection and return the decoded RESP2 reply.

    Strings come back as ``str``, integers as ``int``, nil as ``None``, arrays as
    lists. An error reply raises ``RedisReplyError``; a dead or hung server raises
    ``OSError`` (``ConnectionRefusedError``, ``TimeoutError``, ...).
    """
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(_encode(args))
        with sock.makefile("rb") as stream:
            return _read_reply(stream)


def pipeline(port: int, *commands: Sequence[Any], host: str = HOST, timeout: float = 2.0) -> list[Any]:
    """Send several commands on ONE connection (e.g. ``SET`` then ``WAIT``, which only
    counts the acks of its own connection's writes). Error replies are returned as
    ``RedisReplyError`` instances, not raised."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(b"".join(_encode(cmd) for cmd in commands))
        replies: list[Any] = []
        with sock.makefile("rb") as stream:
            for _ in commands:
                try:
                    replies.append(_read_reply(stream))
                except RedisReplyError as exc:
                    replies.append(exc)
        return replies


def parse_info(text: str) -> dict[str, str]:
    result: dict[str, str] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or ":" not in line:
            continue
        key, _, value = line.partition(":")
        result[key] = value
    return result


def info(port: int, section: str | None = None, *, timeout: float = 2.0) -> dict[str, str]:
    """``INFO [section]`` as a dict of strings."""
    args = ("INFO", section) if section else ("INFO",)
    return parse_info(command(port, *args, timeout=timeout))


def pairs_to_dict(flat: Sequence[Any]) -> dict[str, Any]:
    """``[k1, v1, k2, v2]`` (as SENTINEL MASTER returns) to a dict."""
    return {str(flat[i]): flat[i + 1] for i in range(0, len(flat) - 1, 2)}


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    *,
    what: str,
    interval: float = 0.05,
) -> T:
    """Poll ``predicate`` until it returns something truthy, then return that.

    ``NotReady``, ``OSError`` and ``RedisReplyError`` raised by the predicate count
    as "not yet"; the last one is quoted in the ``TimeoutError`` raised at the
    deadline. Never waits longer than ``timeout`` (plus one predicate call).
    """
    deadline = time.monotonic() + timeout
    last = "predicate returned a false value"
    while True:
        try:
            result = predicate()
            if result:
                return result
        except (NotReady, OSError, RedisReplyError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {what}; last: {last}")
        time.sleep(interval)


# --------------------------------------------------------------------------- process registry

_live_lock = threading.Lock()
_live: set[RedisServer] = set()


def _kill_leftovers() -> None:
    with _live_lock:
        servers = list(_live)
    for server in servers:
        with contextlib.suppress(Exception):  # best effort at exit
            server.kill()


atexit.register(_kill_leftovers)

_SETPRIV = shutil.which("setpriv") if sys.platform.startswith("linux") else None


def _tail(path: Path, offset: int = 0, limit: int = 6000) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    text = data.decode(errors="replace")
    if len(text) > limit:
        text = "...\n" + text[-limit:]
    return text


# --------------------------------------------------------------------------- RedisServer


class RedisServer:
    """One ``redis-server`` child process on 127.0.0.1.

    ``RedisServer().start()`` runs::

        redis-server --port P --bind 127.0.0.1 --save "" --appendonly no
                     --dir <dir> --daemonize no --enable-debug-command local
                     --repl-diskless-sync-delay 0 --shutdown-on-sigterm "nosave now" [args...]

    with stdout/stderr appended to ``<dir>/redis.log``. With ``sentinel_config``
    it instead writes ``<dir>/sentinel.conf`` (``port``/``bind``/``dir`` lines first,
    then the given text) and runs ``redis-server sentinel.conf --sentinel``; Sentinel
    rewrites that file itself afterwards.

    ``base_dir``: the server gets ``base_dir/name``; without it a private temp dir
    is created and removed by ``close()``.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        base_dir: str | os.PathLike[str] | None = None,
        name: str | None = None,
        args: Sequence[str] = (),
        cluster_bus: bool = False,
        sentinel_config: str | None = None,
        startup_timeout: float = 10.0,
    ) -> None:
        self._auto_port = port is None
        self._cluster_bus = cluster_bus
        self.port: int = port if port is not None else free_port(cluster_bus=cluster_bus)
        self.args: list[str] = list(args)
        self.sentinel_config = sentinel_config
        self.startup_timeout = startup_timeout
        self.name = name or (f"sentinel-{self.port}" if sentinel_config is not None else f"redis-{self.port}")
        if base_dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
            self._owns_dir = True
        else:
            self.dir = Path(base_dir) / self.name
            self.dir.mkdir(parents=True, exist_ok=True)
            self._owns_dir = False
        self.log_path = self.dir / ("sentinel.log" if self.is_sentinel else "redis.log")
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False
        self._ever_started = False
        self._config_written = False

    # -- addresses
    @property
    def host(self) -> str:
        return HOST

    @property
    def address(self) -> tuple[str, int]:
        return (HOST, self.port)

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def is_sentinel(self) -> bool:
        return self.sentinel_config is not None

    @property
    def config_path(self) -> Path:
        return self.dir / "sentinel.conf"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def is_running(self) -> bool:
        """The process exists (it may be paused)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def is_paused(self) -> bool:
        return self.is_running and self._paused

    @property
    def is_responsive(self) -> bool:
        return self.is_running and not self._paused

    def log(self) -> str:
        return _tail(self.log_path, limit=200_000)

    def __repr__(self) -> str:
        state = "paused" if self.is_paused else "running" if self.is_running else "stopped"
        return f"<RedisServer {self.name} {HOST}:{self.port} {state}>"

    # -- talking to it
    def command(self, *args: Any, timeout: float = 2.0) -> Any:
        return command(self.port, *args, timeout=timeout)

    def pipeline(self, *commands: Sequence[Any], timeout: float = 2.0) -> list[Any]:
        return pipeline(self.port, *commands, timeout=timeout)

    def info(self, section: str | None = None, *, timeout: float = 2.0) -> dict[str, str]:
        return info(self.port, section, timeout=timeout)

    def ping(self, timeout: float = 0.5) -> bool:
        try:
            return bool(self.command("PING", timeout=timeout) == "PONG")
        except (OSError, RedisReplyError):
            return False

    # -- lifecycle
    def _argv(self) -> list[str]:
        binary = redis_server_bin()
        if binary is None:
            raise RedisStartError("redis-server not found on PATH")
        if self.is_sentinel:
            argv = [binary, str(self.config_path), "--sentinel"]
        else:
            argv = [
                binary,
                "--port", str(self.port),
                "--bind", HOST,
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.dir),
                "--daemonize", "no",
                "--enable-debug-command", "local",
                # Full syncs start at once (the default waits 5 s for more replicas).
                "--repl-diskless-sync-delay", "0",
                # SIGTERM (stop()) must not wait up to 10 s for a lagging/paused replica.
                "--shutdown-on-sigterm", "nosave now",
                *self.args,
            ]  # fmt: skip
        # Die with the test process even if it is SIGKILLed. PDEATHSIG fires when the
        # *thread* that forked exits, so only use it from the main thread.
        if _SETPRIV and threading.current_thread() is threading.main_thread():
            argv = [_SETPRIV, "--pdeathsig", "KILL", *argv]
        return argv

    def _write_sentinel_config(self) -> None:
        assert self.sentinel_config is not None
        text = (
            f"port {self.port}\n"
            f"bind {HOST}\n"
            f'dir "{self.dir}"\n'
            "daemonize no\n"
            'logfile ""\n'
            f"{self.sentinel_config.strip()}\n"
        )
        self.config_path.write_text(text)

    def start(self, timeout: float | None = None) -> RedisServer:
        """Start the process and wait until it answers on its port (its own PID, via INFO)."""
        if self.is_running:
            return self
        timeout = self.startup_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            if self.is_sentinel and not self._config_written:
                self._write_sentinel_config()
            offset = self._spawn()
            try:
                self._wait_ready(offset, deadline)
            except _AddressInUse as exc:
                self._reap(force=True)
                if self._auto_port and not self._ever_started:
                    # Someone took our probed port: move to another one.
                    self.port = free_port(cluster_bus=self._cluster_bus)
                    continue
                # A fixed port (or a restart): it may be freed again shortly.
                if time.monotonic() >= deadline:
                    raise RedisStartError(f"{self.name}: port {self.port} stays in use\n{exc}") from None
                time.sleep(0.2)
                continue
            self._ever_started = True
            self._config_written = True
            return self

    def _spawn(self) -> int:
        with self.log_path.open("ab") as log:
            log.write(f"==== {time.strftime('%H:%M:%S')} starting {self.name} on port {self.port}\n".encode())
            log.flush()
            offset = log.tell()
            self._proc = subprocess.Popen(
                self._argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
            )
        self._paused = False
        with _live_lock:
            _live.add(self)
        return offset

    def _startup_failure(self, offset: int, reason: str) -> RedisStartError:
        log = _tail(self.log_path, offset)
        msg = f"{self.name} on port {self.port} {reason}\n--- {self.log_path} ---\n{log}"
        print(msg, file=sys.stderr)  # pytest shows captured stderr for the failing test
        return RedisStartError(msg)

    def _wait_ready(self, offset: int, deadline: float) -> None:
        assert self._proc is not None
        proc = self._proc
        while True:
            rc = proc.poll()
            if rc is not None:
                log = _tail(self.log_path, offset)
                if "Address already in use" in log:
                    raise _AddressInUse(log)
                raise self._startup_failure(offset, f"exited with status {rc} during startup")
            try:
                pid = int(self.info("server", timeout=0.5).get("process_id", "-1"))
            except (OSError, RedisReplyError, ValueError):
                pid = None
            if pid == proc.pid:
                return
            if pid is not None:
                # Something else answers on our port: ours will fail its bind.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=max(0.1, min(3.0, deadline - time.monotonic())))
                raise _AddressInUse(f"another server (pid {pid}) answers on port {self.port}")
            if time.monotonic() >= deadline:
                self._reap(force=True)
                raise self._startup_failure(offset, "did not answer INFO before the deadline")
            time.sleep(0.02)

    def _reap(self, *, force: bool, timeout: float = 5.0) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            if self._paused:
                os.kill(proc.pid, signal.SIGCONT)
            if force:
                proc.kill()
                proc.wait(timeout)
            else:
                proc.terminate()
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout)
        else:
            proc.wait()
        self._proc = None
        self._paused = False
        with _live_lock:
            _live.discard(self)

    def stop(self, timeout: float = 5.0) -> None:
        """Graceful shutdown (SIGCONT if paused, SIGTERM, SIGKILL after ``timeout``)."""
        self._reap(force=False, timeout=timeout)

    def kill(self) -> None:
        """SIGKILL: a crash. Clients see connection resets/refusals."""
        self._reap(force=True)

    def restart(self, *, args: Sequence[str] | None = None, timeout: float | None = None) -> RedisServer:
        """Stop if running, then start again on the same port (empty data: no persistence).

        ``args`` replaces the extra arguments (e.g. a new ``--replicaof``).
        """
        self.stop()
        if args is not None:
            self.args = list(args)
        return self.start(timeout)

    def pause(self) -> None:
        """SIGSTOP: the kernel still accepts connections, but nothing is ever answered."""
        if not self.is_running:
            raise RuntimeError(f"{self.name} is not running")
        assert self._proc is not None
        os.kill(self._proc.pid, signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT after ``pause``."""
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGCONT)
        self._paused = False

    def close(self) -> None:
        """Stop (killing if needed) and remove the directory if it is a private temp dir."""
        try:
            self.stop()
        finally:
            if self._owns_dir:
                shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class _AddressInUse(Exception):
    pass


# --------------------------------------------------------------------------- cluster


def key_slot(key: str | bytes) -> int:
    """Cluster hash slot of a key (CRC16 mod 16384, honouring ``{hash tags}``)."""
    from redis.crc import key_slot as _key_slot

    return int(_key_slot(key.encode() if isinstance(key, str) else key))


class _Group:
    """Shared temp-dir ownership and teardown for multi-process topologies."""

    def __init__(self, base_dir: str | os.PathLike[str] | None, prefix: str) -> None:
        if base_dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix=prefix))
            self._owns_dir = True
        else:
            self.dir = Path(base_dir)
            self.dir.mkdir(parents=True, exist_ok=True)
            self._owns_dir = False

    def _all_servers(self) -> list[RedisServer]:
        raise NotImplementedError

    def stop(self) -> None:
        """Stop every process (each one is tried even if another fails)."""
        errors: list[BaseException] = []
        for server in self._all_servers():
            try:
                server.stop()
            except BaseException as exc:
                errors.append(exc)
                with contextlib.suppress(BaseException):
                    server.kill()
        if errors:
            raise errors[0]

    def close(self) -> None:
        try:
            self.stop()
        finally:
            if self._owns_dir:
                shutil.rmtree(self.dir, ignore_errors=True)

    def logs(self) -> str:
        """Tails of every process's log (for failure messages)."""
        parts = [f"--- {s.name} ({s!r}) ---\n{_tail(s.log_path, limit=3000)}" for s in self._all_servers()]
        return "\n".join(parts)


class RedisCluster(_Group):
    """``masters`` masters (>= 3) with ``replicas_per_master`` replicas each, on loopback.

    Each node runs in its own directory with ``--cluster-enabled yes
    --cluster-config-file nodes.conf --cluster-node-timeout <node_timeout_ms>`` on a
    port whose bus port (port + 10000) was free too. The cluster is made by
    ``redis-cli --cluster create ... --cluster-replicas R --cluster-yes``.
    """

    def __init__(
        self,
        masters: int = 3,
        replicas_per_master: int = 0,
        *,
        base_dir: str | os.PathLike[str] | None = None,
        node_timeout_ms: int = 2000,
        extra_args: Sequence[str] = (),
    ) -> None:
        if masters < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 masters")
        super().__init__(base_dir, "redis-cluster-")
        self.n_masters = masters
        self.replicas_per_master = replicas_per_master
        self.node_timeout_ms = node_timeout_ms
        args = [
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(node_timeout_ms),
            *extra_args,
        ]  # fmt: skip
        total = masters * (1 + replicas_per_master)
        self.nodes: list[RedisServer] = [
            RedisServer(base_dir=self.dir, name=f"node{i}", args=args, cluster_bus=True) for i in range(total)
        ]
        self.create_output = ""

    def _all_servers(self) -> list[RedisServer]:
        return list(self.nodes)

    def __repr__(self) -> str:
        return f"<RedisCluster {[n.port for n in self.nodes]}>"

    # -- lifecycle
    def start(self, timeout: float = 40.0) -> RedisCluster:
        """Start the nodes, create the cluster and wait until it is healthy everywhere."""
        deadline = time.monotonic() + timeout
        try:
            for node in self.nodes:
                node.start()
            self._create(max(5.0, deadline - time.monotonic()))
            self.wait_ok(max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        return self

    def _create(self, timeout: float) -> None:
        cli = redis_cli_bin()
        if cli is None:
            raise RedisStartError("redis-cli not found on PATH")
        argv = [
            cli, "--cluster", "create",
            *(f"{HOST}:{n.port}" for n in self.nodes),
            "--cluster-replicas", str(self.replicas_per_master),
            "--cluster-yes",
        ]  # fmt: skip
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            out = (exc.stdout or b"").decode(errors="replace")
            raise RedisStartError(f"redis-cli --cluster create timed out\n{out}\n{self.logs()}") from None
        self.create_output = done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
        if done.returncode != 0 or "[OK] All 16384 slots covered" not in self.create_output:
            msg = f"redis-cli --cluster create failed (rc {done.returncode})\n{self.create_output}\n{self.logs()}"
            print(msg, file=sys.stderr)
            raise RedisStartError(msg)

    # -- state
    def responsive_nodes(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.is_responsive]

    def _by_port(self, port: int) -> RedisServer:
        for node in self.nodes:
            if node.port == port:
                return node
        raise KeyError(f"port {port} is not a node of this cluster")

    def slot_map(self, node: RedisServer | None = None) -> list[tuple[int, int, int]]:
        """``CLUSTER SLOTS`` as sorted ``(first, last, master_port)`` ranges, from ``node``."""
        node = node or self._any_node()
        ranges = [(int(r[0]), int(r[1]), int(r[2][1])) for r in node.command("CLUSTER", "SLOTS")]
        return sorted(ranges)

    def _any_node(self) -> RedisServer:
        nodes = self.responsive_nodes()
        if not nodes:
            raise RuntimeError("no cluster node is running")
        return nodes[0]

    def cluster_nodes(self, node: RedisServer | None = None) -> list[dict[str, Any]]:
        """``CLUSTER NODES`` parsed: id, port, flags (set), master_id, link_state, slots."""
        node = node or self._any_node()
        rows = []
        for line in node.command("CLUSTER", "NODES").splitlines():
            fields = line.split()
            if len(fields) < 8:
                continue
            addr = fields[1].split("@")[0]
            rows.append(
                {
                    "id": fields[0],
                    "port": int(addr.rsplit(":", 1)[1]) if ":" in addr else 0,
                    "flags": set(fields[2].split(",")),
                    "master_id": None if fields[3] == "-" else fields[3],
                    "link_state": fields[7],
                    "slots": fields[8:],
                }
            )
        return rows

    def _live_with_flag(self, flag: str) -> list[RedisServer]:
        out = []
        for row in self.cluster_nodes():
            if flag in row["flags"] and "fail" not in row["flags"]:
                out.append(self._by_port(row["port"]))
        return sorted(out, key=self.nodes.index)

    @property
    def masters(self) -> list[RedisServer]:
        """Nodes that are masters now and not failed (per a responsive node's view)."""
        return self._live_with_flag("master")

    @property
    def replicas(self) -> list[RedisServer]:
        return self._live_with_flag("slave")

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """(host, port) of every running node, masters first."""
        running = [n for n in self.nodes if n.is_running]
        try:
            masters = set(self.masters)
        except (OSError, RedisReplyError, RuntimeError):
            masters = set()
        running.sort(key=lambda n: (n not in masters, self.nodes.index(n)))
        return [n.address for n in running]

    @property
    def seed_urls(self) -> list[str]:
        """``redis://127.0.0.1:P`` for every running node, masters first (cluster = db 0)."""
        return [f"redis://{h}:{p}" for h, p in self.startup_nodes]

    def node_for_slot(self, slot: int) -> RedisServer:
        """The master serving ``slot`` now (asked with CLUSTER SLOTS)."""
        if not 0 <= slot < CLUSTER_SLOTS:
            raise ValueError(f"slot {slot} out of range")
        for first, last, port in self.slot_map():
            if first <= slot <= last:
                return self._by_port(port)
        raise LookupError(f"slot {slot} is not served by any node")

    def node_for_key(self, key: str | bytes) -> RedisServer:
        return self.node_for_slot(key_slot(key))

    key_slot = staticmethod(key_slot)

    def check_ok(self) -> bool:
        """Raise ``NotReady`` unless every responsive node agrees the cluster is healthy."""
        nodes = self.responsive_nodes()
        if not nodes:
            raise NotReady("no node is running")
        alive_ports = {n.port for n in nodes}
        maps = []
        for node in nodes:
            ci = parse_info(node.command("CLUSTER", "INFO", timeout=1.0))
            if ci.get("cluster_state") != "ok":
                raise NotReady(f"{node.name}: cluster_state={ci.get('cluster_state')}")
            for key in ("cluster_slots_assigned", "cluster_slots_ok"):
                if ci.get(key) != str(CLUSTER_SLOTS):
                    raise NotReady(f"{node.name}: {key}={ci.get(key)}")
            if ci.get("cluster_known_nodes") != str(len(self.nodes)):
                raise NotReady(f"{node.name}: cluster_known_nodes={ci.get('cluster_known_nodes')}")
            slot_map = self.slot_map(node)
            covered = sum(last - first + 1 for first, last, _ in slot_map)
            if covered != CLUSTER_SLOTS:
                raise NotReady(f"{node.name}: CLUSTER SLOTS covers {covered} slots")
            dead = {port for _, _, port in slot_map} - alive_ports
            if dead:
                raise NotReady(f"{node.name}: slots still assigned to stopped node(s) {sorted(dead)}")
            maps.append(slot_map)
            self._check_roles(node, alive_ports)
            repl = node.info("replication", timeout=1.0)
            if repl.get("role") == "slave" and repl.get("master_link_status") != "up":
                raise NotReady(f"{node.name}: replica link {repl.get('master_link_status')}")
        if any(m != maps[0] for m in maps[1:]):
            raise NotReady("nodes disagree on the slot map")
        return True

    def _check_roles(self, node: RedisServer, alive_ports: set[int]) -> None:
        """``node``'s CLUSTER NODES view: ``n_masters`` masters own the slots, and every
        other running node is a replica of one of them. (Right after ``--cluster
        create`` the replicas are still empty masters until CLUSTER REPLICATE
        propagates.) Stopped/paused nodes are skipped: their flags lag."""
        rows = self.cluster_nodes(node)
        owners = {r["id"] for r in rows if "master" in r["flags"] and r["slots"]}
        if len(owners) != self.n_masters:
            raise NotReady(f"{node.name} sees {len(owners)} masters with slots, expected {self.n_masters}")
        for row in rows:
            if row["port"] not in alive_ports:
                continue
            bad = row["flags"] & {"fail", "fail?", "handshake", "noaddr"}
            if bad:
                raise NotReady(f"{node.name} flags port {row['port']} as {sorted(bad)}")
            if "master" in row["flags"] and not row["slots"]:
                raise NotReady(f"{node.name} sees port {row['port']} as a master without slots")
            if "slave" in row["flags"] and row["master_id"] not in owners:
                raise NotReady(f"{node.name} sees replica {row['port']} of a master without slots")

    def wait_ok(self, timeout: float = 20.0) -> None:
        """Wait until every responsive node reports cluster_state:ok, all slots are covered
        by responsive masters, all nodes agree on CLUSTER SLOTS and on the roles (no
        failed/empty masters, every replica attached) and replicas are in sync.

        After ``kill_node`` of a master with replicas this is also the wait for the
        failover; with no replicas it times out (the slots stay on the dead node)."""
        try:
            wait_until(self.check_ok, timeout, what="cluster_state:ok on every node", interval=0.1)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.logs()}") from None

    # -- faults
    def _node(self, node: RedisServer | int) -> RedisServer:
        if isinstance(node, RedisServer):
            if node not in self.nodes:
                raise KeyError(f"{node!r} is not a node of this cluster")
            return node
        return self._by_port(node)

    def kill_node(self, node: RedisServer | int) -> RedisServer:
        """SIGKILL one node (given as a RedisServer or a port); returns it."""
        server = self._node(node)
        server.kill()
        return server

    def restart_node(self, node: RedisServer | int, *, wait: bool = True, timeout: float = 20.0) -> RedisServer:
        """Start a stopped node again on its port; it rejoins from its nodes.conf (data empty)."""
        server = self._node(node)
        if server.is_paused:
            server.resume()
        if not server.is_running:
            server.start()
        if wait:
            self.wait_ok(timeout)
        return server

    def heal(self, timeout: float = 30.0) -> None:
        """Resume paused and restart stopped nodes, then ``wait_ok``."""
        for node in self.nodes:
            if node.is_paused:
                node.resume()
            elif not node.is_running:
                node.start()
        self.wait_ok(timeout)

    def flushall(self) -> None:
        """FLUSHALL on every master (and SCRIPT FLUSH, so script caches start empty too)."""
        for node in self.masters:
            node.command("FLUSHALL")
            node.command("SCRIPT", "FLUSH")

    def __enter__(self) -> RedisCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- sentinel


class RedisSentinelSet(_Group):
    """A master, ``replicas`` replicas (``--replicaof``) and 1 or 3 sentinels.

    Sentinels run ``redis-server sentinel.conf --sentinel`` with::

        sentinel monitor <master_name> 127.0.0.1 <master port> <quorum>
        sentinel down-after-milliseconds <master_name> 1000
        sentinel failover-timeout <master_name> 5000

    ``quorum`` defaults to a majority of the sentinels (1 of 1, 2 of 3).
    """

    def __init__(
        self,
        sentinels: int = 1,
        *,
        replicas: int = 1,
        master_name: str = "mymaster",
        quorum: int | None = None,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        base_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if sentinels < 1 or replicas < 1:
            raise ValueError("need at least one sentinel and one replica")
        super().__init__(base_dir, "redis-sentinel-")
        self.master_name = master_name
        self.quorum = quorum if quorum is not None else sentinels // 2 + 1
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        # --replicaof and the sentinel config are filled in by start(), once the
        # master's port is final (start() may move a server to another free port).
        self.data_nodes: list[RedisServer] = [
            RedisServer(base_dir=self.dir, name=f"data{i}") for i in range(replicas + 1)
        ]
        self.sentinels: list[RedisServer] = [
            RedisServer(base_dir=self.dir, name=f"sentinel{i}", sentinel_config="") for i in range(sentinels)
        ]
        self._master: RedisServer = self.data_nodes[0]

    def _sentinel_config(self, master_port: int) -> str:
        name = self.master_name
        return (
            f"sentinel monitor {name} {HOST} {master_port} {self.quorum}\n"
            f"sentinel down-after-milliseconds {name} {self.down_after_ms}\n"
            f"sentinel failover-timeout {name} {self.failover_timeout_ms}\n"
            f"sentinel parallel-syncs {name} 1\n"
        )

    def _all_servers(self) -> list[RedisServer]:
        # Sentinels first, so that stopping the data nodes triggers no failover.
        return [*self.sentinels, *self.data_nodes]

    def __repr__(self) -> str:
        return (
            f"<RedisSentinelSet {self.master_name} master={self._master.port} "
            f"data={[n.port for n in self.data_nodes]} sentinels={[s.port for s in self.sentinels]}>"
        )

    # -- addresses
    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """[(host, port)] of the sentinels, e.g. for ``redis.asyncio.sentinel.Sentinel(...)``."""
        return [s.address for s in self.sentinels]

    @property
    def sentinel_urls(self) -> list[str]:
        return [f"redis://{HOST}:{s.port}" for s in self.sentinels]

    @property
    def master(self) -> RedisServer:
        """The data node this helper last saw promoted (no network call)."""
        return self._master

    @property
    def replicas(self) -> list[RedisServer]:
        """Running data nodes other than the master."""
        return [n for n in self.data_nodes if n is not self._master and n.is_running]

    def _by_port(self, port: int) -> RedisServer:
        for node in self.data_nodes:
            if node.port == port:
                return node
        raise KeyError(f"port {port} is not a data node of this set")

    def master_addr_from(self, sentinel: RedisServer) -> tuple[str, int]:
        reply = sentinel.command("SENTINEL", "get-master-addr-by-name", self.master_name, timeout=1.0)
        if not reply:
            raise NotReady(f"{sentinel.name} does not know {self.master_name!r}")
        host, port = reply
        return (str(host), int(port))

    def master_address(self) -> tuple[str, int]:
        """Ask the sentinels (the first that answers) for the master address."""
        last: Exception | None = None
        for sentinel in self.sentinels:
            if not sentinel.is_responsive:
                continue
            try:
                return self.master_addr_from(sentinel)
            except (OSError, RedisReplyError, NotReady, ValueError) as exc:
                last = exc
        raise RuntimeError(f"no sentinel answered get-master-addr-by-name: {last}")

    # -- lifecycle
    def start(self, timeout: float = 30.0) -> RedisSentinelSet:
        """Start master and replicas, wait for the sync, start the sentinels, ``wait_stable``."""
        deadline = time.monotonic() + timeout
        try:
            master = self.data_nodes[0]
            master.start()
            for node in self.data_nodes[1:]:
                node.args = ["--replicaof", HOST, str(master.port)]
                node.start()
            # Sync before the sentinels look: a replica first seen with a down link is
            # only re-read by Sentinel 10 s later.
            self._wait_replicas_synced(max(1.0, deadline - time.monotonic()))
            for sentinel in self.sentinels:
                sentinel.sentinel_config = self._sentinel_config(master.port)
                sentinel.start()
            self.wait_stable(max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_replicas_synced(self, timeout: float) -> None:
        master = self._master

        def synced() -> bool:
            for node in self.replicas:
                if not node.is_responsive:
                    continue
                repl = node.info("replication", timeout=1.0)
                if repl.get("role") != "slave" or repl.get("master_port") != str(master.port):
                    raise NotReady(f"{node.name} is not a replica of {master.port} yet")
                if repl.get("master_link_status") != "up" or repl.get("master_sync_in_progress") != "0":
                    raise NotReady(f"{node.name}: link {repl.get('master_link_status')}")
            return True

        wait_until(synced, timeout, what=f"replicas in sync with {master.name}", interval=0.05)

    def check_stable(self) -> bool:
        """Raise ``NotReady`` unless every sentinel agrees on a healthy master, sees every
        running replica with an ``ok`` link, and (with several) sees its peers."""
        master = self._master
        if not master.is_responsive:
            raise NotReady(f"master {master.name} is not running")
        if master.info("replication", timeout=1.0).get("role") != "master":
            raise NotReady(f"{master.name} does not report role:master")
        expect_replicas = {n.port for n in self.replicas if n.is_responsive}
        for sentinel in self.sentinels:
            if not sentinel.is_responsive:
                continue
            if self.master_addr_from(sentinel) != master.address:
                raise NotReady(f"{sentinel.name} reports another master")
            state = pairs_to_dict(sentinel.command("SENTINEL", "MASTER", self.master_name, timeout=1.0))
            if state.get("flags") != "master":
                raise NotReady(f"{sentinel.name}: master flags {state.get('flags')}")
            others = int(state.get("num-other-sentinels", 0))
            if others < len([s for s in self.sentinels if s.is_responsive]) - 1:
                raise NotReady(f"{sentinel.name} knows {others} other sentinels")
            seen = set()
            for raw in sentinel.command("SENTINEL", "REPLICAS", self.master_name, timeout=1.0):
                rep = pairs_to_dict(raw)
                healthy = rep.get("flags") == "slave" and rep.get("master-link-status") == "ok"
                if healthy and int(rep.get("master-port", -1)) == master.port:
                    seen.add(int(rep["port"]))
            missing = expect_replicas - seen
            if missing:
                raise NotReady(f"{sentinel.name} does not yet see healthy replica(s) {sorted(missing)}")
        return True

    def wait_stable(self, timeout: float = 20.0) -> None:
        """Wait for ``check_stable`` (replicas in sync, sentinels agree, peers known)."""
        try:
            self._wait_replicas_synced(timeout)
            wait_until(self.check_stable, timeout, what="a stable sentinel set", interval=0.1)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.logs()}") from None

    # -- failover
    def failover(self, timeout: float = 20.0, *, demote_old: bool = True) -> RedisServer:
        """``SENTINEL FAILOVER``; wait until the sentinels report the new master and it is
        writable; returns it.

        ``demote_old``: Sentinel itself turns the old (still running) master into a
        replica only ~10 s later (it waits 4 hello periods after the switch, then its
        next 10 s INFO). Until then the old master still accepts writes from clients
        holding connections to it. By default this helper sends the old master
        ``REPLICAOF <new>`` at once (what Sentinel will do anyway) and waits for the
        link, so no stray writes land there; pass False to observe the raw window.
        """
        deadline = time.monotonic() + timeout
        old = self._master
        sentinel = next(s for s in self.sentinels if s.is_responsive)

        def trigger() -> bool:
            try:
                sentinel.command("SENTINEL", "FAILOVER", self.master_name, timeout=1.0)
            except RedisReplyError as exc:
                # NOGOODSLAVE: Sentinel's view of the replicas is not fresh enough yet;
                # INPROG: a previous failover is still finishing.
                if "NOGOODSLAVE" in str(exc) or "INPROG" in str(exc):
                    raise NotReady(str(exc)) from None
                raise
            return True

        wait_until(trigger, max(0.5, deadline - time.monotonic()), what="SENTINEL FAILOVER to be accepted",
                   interval=0.2)  # fmt: skip
        new = self.wait_for_promotion(old, timeout=max(1.0, deadline - time.monotonic()))
        if demote_old and old.is_responsive:
            self._demote(old, new, max(1.0, deadline - time.monotonic()))
        return new

    def kill_master(self) -> RedisServer:
        """SIGKILL the current master (an unplanned failover follows); returns it."""
        old = self._master
        old.kill()
        return old

    def wait_for_promotion(self, old_master: RedisServer | None = None, timeout: float = 20.0) -> RedisServer:
        """Wait until every responsive sentinel reports the same master, other than
        ``old_master``, and that node reports role:master; returns it and records it
        as ``self.master``. Unplanned (after ``kill_master``) this takes roughly
        down-after (1 s) + election + promotion: ~3-6 s."""
        old = old_master or self._master

        def promoted() -> RedisServer:
            addrs = {self.master_addr_from(s) for s in self.sentinels if s.is_responsive}
            if len(addrs) != 1:
                raise NotReady(f"sentinels disagree: {sorted(addrs)}")
            ((_, port),) = addrs
            if port == old.port:
                raise NotReady(f"sentinels still report {old.name}")
            node = self._by_port(port)
            if not node.is_responsive:
                raise NotReady(f"sentinels report {node.name}, which is not running")
            if node.info("replication", timeout=1.0).get("role") != "master":
                raise NotReady(f"{node.name} is not role:master yet")
            # get-master-addr-by-name already answers with the promoted replica while
            # the failover is still finishing; clients (redis-py's discover_master)
            # read SENTINEL MASTERS and reject a master flagged s_down/o_down.
            for sentinel in self.sentinels:
                if not sentinel.is_responsive:
                    continue
                state = pairs_to_dict(sentinel.command("SENTINEL", "MASTER", self.master_name, timeout=1.0))
                if int(state.get("port", -1)) != port or state.get("flags") != "master":
                    raise NotReady(f"{sentinel.name}: master {state.get('port')} flags {state.get('flags')}")
            return node

        try:
            new = wait_until(promoted, timeout, what=f"a master other than {old.name}", interval=0.1)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.logs()}") from None
        self._master = new
        return new

    def _demote(self, node: RedisServer, master: RedisServer, timeout: float) -> None:
        node.command("REPLICAOF", HOST, str(master.port))

        def linked() -> bool:
            repl = node.info("replication", timeout=1.0)
            if repl.get("role") != "slave" or repl.get("master_port") != str(master.port):
                raise NotReady(f"{node.name} role {repl.get('role')}")
            if repl.get("master_link_status") != "up":
                raise NotReady(f"{node.name} link {repl.get('master_link_status')}")
            return True

        wait_until(linked, timeout, what=f"{node.name} to replicate from {master.name}", interval=0.05)

    def heal(self, timeout: float = 30.0) -> None:
        """Resume paused processes, restart stopped data nodes as replicas of the current
        master and stopped sentinels, then ``wait_stable``."""
        for server in self._all_servers():
            if server.is_paused:
                server.resume()
        master = self._master
        if not master.is_running:
            raise RuntimeError("the recorded master is down; call wait_for_promotion() first")
        for sentinel in self.sentinels:
            if not sentinel.is_running:
                sentinel.start()
        for node in self.data_nodes:
            if node is master:
                continue
            if not node.is_running:
                node.restart(args=["--replicaof", HOST, str(master.port)])
            elif node.info("replication").get("role") == "master":
                node.command("REPLICAOF", HOST, str(master.port))
        self.wait_stable(timeout)

    def flushall(self) -> None:
        """FLUSHALL + SCRIPT FLUSH on the master (replicated to the replicas)."""
        self._master.command("FLUSHALL")
        self._master.command("SCRIPT", "FLUSH")

    def __enter__(self) -> RedisSentinelSet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
