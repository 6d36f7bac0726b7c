"""The ``gateway`` command.

    gateway run   [-c conf/limits.yaml] [--listen ADDR]... [--upstream NAME=ADDR[,ADDR]]... [--workers N]
    gateway check [-c conf/limits.yaml]          like nginx -t: every error with file:line: key: reason
    gateway reload [-c ...] [--pid FILE]         like nginx -s reload (through the admin API, which reports
                                                 errors; SIGHUP through the pid file with --pid or admin off)
    gateway stop   [-c ...] [--pid FILE] [--timeout 60s]   like nginx -s quit: SIGTERM, wait for the exit
    gateway ban <ip|cidr> [--for 1h] [--reason TEXT] [--force] [-c ...]
    gateway ban --file blocklist.txt [--for 1d] [--reason feed] [--force]   one IP/CIDR a line; - = stdin
    gateway unban <ip|cidr> | --file blocklist.txt [-c ...]
    gateway bans [--match 10.0.0.0/8] [--reason TEXT] [--limit 100] [--offset 0] [--json] [-c ...]
    gateway zone show|reset ZONE KEY [-c ...]    one key's limit state (admin API /zones/ZONE/KEY)
    gateway token [--show] [--rotate] [-c ...]   where the admin token is (--show: the token; --rotate:
                                                 a new one, taken by the running gateway at its next call)
    gateway demo-upstream [--listen ADDR]...     a small echo server to try the gateway with
    gateway import-nginx <nginx.conf> [-o limits.yaml]
    gateway replay <access.log> [-c limits.yaml] [--format F] [--reorder-window 120s] [--json] [--html report.html]
    gateway --version

ban, unban and bans talk to the configured Redis directly (every node sees the
change within a second), or, with the embedded store, to the running node's
admin API (admin.listen, with admin.token, or the token the gateway wrote to
admin.token_file when none is configured).

Exit codes: 0 success, 1 configuration or runtime error. A bad configuration
never prints a Python traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from gateway import __version__
from gateway.background import spawn
from gateway.config.overrides import Overrides
from gateway.config.paths import default_path as default_pid_path
from gateway.config.paths import runtime_dir
from gateway.config.units import parse_duration_ms
from gateway.errors import BanStoreError, ConfigErrors, GatewayError
from gateway.logs import error as errorlog
from gateway.plan import load_config
from gateway.replay.logread import MAX_WINDOW_MS
from gateway.runtime import pidfile

DEFAULT_CONFIG = "conf/limits.yaml"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description="A rate-limiting reverse proxy gateway.")
    parser.add_argument("--version", action="version", version=f"gateway {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="run the gateway")
    run.add_argument("-c", "--config", default=DEFAULT_CONFIG, help="configuration file (default: %(default)s)")
    run.add_argument(
        "--listen",
        action="append",
        default=[],
        metavar="ADDR",
        help="listen on ADDR instead of the file's listen (repeatable; 'ADDR ssl' for TLS)",
    )
    run.add_argument(
        "--upstream",
        action="append",
        default=[],
        metavar="NAME=ADDR[,ADDR]",
        help="replace the servers of upstream NAME (repeatable)",
    )
    run.add_argument("--workers", default=None, help="number of worker processes, or auto")
    run.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)

    check = sub.add_parser("check", help="validate the configuration, like nginx -t")
    check.add_argument("-c", "--config", default=DEFAULT_CONFIG, help="configuration file (default: %(default)s)")

    reload = sub.add_parser("reload", help="reload the running gateway's configuration (like nginx -s reload)")
    reload.add_argument("-c", "--config", default=DEFAULT_CONFIG, help="configuration file (default: %(default)s)")
    reload.add_argument(
        "--pid", metavar="FILE", help="send SIGHUP to the process in this pid file instead of calling the admin API"
    )

    stop = sub.add_parser("stop", help="stop the running gateway gracefully (like nginx -s quit) and wait")
    stop.add_argument("-c", "--config", default=DEFAULT_CONFIG, help="configuration file (default: %(default)s)")
    stop.add_argument("--pid", metavar="FILE", help="the pid file (default: the config's pid)")
    stop.add_argument("--timeout", default="60s", help="how long to wait for the drain (default: %(default)s)")

    ban = sub.add_parser("ban", help="ban an IP address or CIDR on every route of every node")
    ban.add_argument("target", nargs="?", help="an IP address or CIDR, e.g. 203.0.113.7 or 10.0.0.0/8")
    ban.add_argument(
        "--file",
        metavar="PATH",
        help="ban every address or CIDR of a blocklist: one a line, # comments, blank lines; - = stdin",
    )
    ban.add_argument("--for", dest="duration", default="1h", help="how long: 30s, 10m, 1h, 1d; 0 = until unbanned")
    ban.add_argument("--reason", default="", help="why (shown by `gateway bans` and in the error log)")
    ban.add_argument(
        "--force",
        action="store_true",
        help="ban even a network wider than /16 (IPv4) or /48 (IPv6), or one covering real_ip.from or access.allow",
    )
    ban.add_argument("-c", "--config", default=DEFAULT_CONFIG, help="configuration file (default: %(default)s)")

    unban = sub.add_parser("unban", help="lift a ban")
    unban.add_argument("target", nargs="?", help="the banned IP address or CIDR")
    unban.add_argument("--file", metavar="PATH", help="lift the bans of every line of a blocklist; - = stdin")
    unban.add_argument("-c", "--config", default=DEFAULT_CONFIG, help="configuration file (default: %(default)s)")

    bans = sub.add_parser("bans", help="list the bans in force")
    bans.add_argument("-c", "--config", default=DEFAULT_CONFIG, help="configuration file (default: %(default)s)")
    bans.add_argument("--json", action="store_true", help="print JSON")
    bans.add_argument("--match", metavar="CIDR", help="only bans that overlap this address or network")
    bans.add_argument("--reason", help="only bans with exactly this reason")
    bans.add_argument("--limit", type=int, default=100, help="how many to show (default: %(default)s)")
    bans.add_argument("--offset", type=int, default=0, help="how many to skip first (default: %(default)s)")

    zone = sub.add_parser("zone", help="see or reset one key's limit state (through the admin API)")
    zone.add_argument("action", choices=("show", "reset"))
    zone.add_argument("zone", help="the zone's name")
    zone.add_argument("key", help="the key as text: a client IP for $binary_remote_addr zones")
    zone.add_argument("-c", "--config", default=DEFAULT_CONFIG, help="configuration file (default: %(default)s)")

    token = sub.add_parser("token", help="where the admin API's token is; --show prints it, --rotate replaces it")
    token.add_argument("--show", action="store_true", help="print the token itself")
    token.add_argument("--rotate", action="store_true", help="write a new token (the old one stops working)")
    token.add_argument("-c", "--config", default=DEFAULT_CONFIG, help="configuration file (default: %(default)s)")

    demo = sub.add_parser("demo-upstream", help="run a small echo upstream to try the gateway with")
    demo.add_argument(
        "--listen",
        action="append",
        default=[],
        metavar="ADDR",
        help="address to listen on (default: 127.0.0.1:9000 and 127.0.0.1:9001)",
    )
    imp = sub.add_parser("import-nginx", help="translate an nginx configuration (exit 2: some directives skipped)")
    imp.add_argument("nginx_conf", help="the nginx.conf to read (includes are followed)")
    imp.add_argument("-o", "--output", default=None, help="where to write the gateway config (default: stdout)")
    imp.add_argument(
        "--allow-open",
        action="store_true",
        help="a guard (if ... return 403, allow/deny) that cannot be translated leaves its route proxying "
        "instead of refusing every request",
    )

    rep = sub.add_parser("replay", help="run an access log through the configured limits and report")
    rep.add_argument("access_log", help="an access log (.gz read as gzip); - for stdin")
    rep.add_argument("-c", "--config", default=DEFAULT_CONFIG, help="configuration file (default: %(default)s)")
    rep.add_argument("--format", default="combined", help="combined, main, gateway, json or a $variable template")
    rep.add_argument(
        "--reorder-window",
        type=_window_ms,
        default="120s",
        metavar="DURATION",
        help="how far out of order log lines are put back in order, at most 1h (default: %(default)s)",
    )
    rep.add_argument("--json", action="store_true", help="print the report as JSON")
    rep.add_argument("--html", default=None, metavar="FILE", help="also write a self-contained HTML report")
    return parser


def _window_ms(text: str) -> int:
    try:
        ms = parse_duration_ms(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if ms < 1000:
        raise argparse.ArgumentTypeError(f"{text!r}: the reorder window is at least 1s (log times are whole seconds)")
    if ms > MAX_WINDOW_MS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the reorder window is at most 1h (the lines of one window are held in memory)"
        )
    return ms


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "check":
            return _check(args)
        if args.command == "demo-upstream":
            return _demo(args)
        if args.command == "import-nginx":
            from gateway.nginxconf.command import run_import

            return run_import(args.nginx_conf, args.output, allow_open=args.allow_open)
        if args.command == "replay":
            from gateway.replay.command import run_replay

            return run_replay(args)
        if args.command == "token":
            from gateway.cli.token import run_token

            return run_token(args)
        if args.command == "stop":
            from gateway.cli.signals import run_stop

            return run_stop(args)
        if args.command == "reload" and (args.pid or _admin_off(args.config)):
            from gateway.cli.signals import signal_reload

            return signal_reload(args)
        if args.command in ("reload", "ban", "unban", "bans", "zone"):
            from gateway.cli.control import run_control

            return run_control(args)
    except ConfigErrors as exc:
        for err in exc.errors:
            print(f"gateway: {err}", file=sys.stderr)
        return 1
    except GatewayError as exc:  # e.g. lua.ScriptsMissing: the start is refused, without a traceback
        print(f"gateway: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    _parser().print_help()
    return 1


def _admin_off(config_path: str) -> bool:
    return load_config(config_path).spec.admin.listen is None


def _check(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    for warning in config.spec.warnings:
        print(f"gateway: warning: {warning}", file=sys.stderr)
    if config.spec.store.redis is None:  # the embedded store keeps its bans in state_dir
        from gateway.bans.database import writable_problem

        problem = writable_problem(config.spec.state_dir)
        if problem is not None:  # a warning: the service may run as another user than this check
            where = config.spec.state_dir
            print(f"gateway: warning: state_dir {where}: {problem}; bans cannot be kept", file=sys.stderr)
    print("ok")
    return 0


def _event_loop_run(coro: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; asyncio still works
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def _run(args: argparse.Namespace) -> int:
    overrides = Overrides.parse(args.listen, args.upstream, args.workers)
    config = load_config(args.config, overrides)
    spec = config.spec
    if spec.store.redis is not None:
        from gateway.bans.redis import require_scripts
        from gateway.store import lua

        lua.require_all()  # a packaging fault refuses the start here, before any worker or Redis call
        require_scripts()  # the ban list's scripts too
    errorlog.configure(spec.log.error, spec.log.level)
    for warning in spec.warnings:
        errorlog.log.warning("%s", warning)
    moved = runtime_dir().fallback_reason
    if moved is not None and not args.worker:
        errorlog.log.warning("runtime directory: %s: not using it; using %s instead", moved, runtime_dir().path)
    from gateway.edge import raise_fd_limit

    if not args.worker:
        raise_fd_limit()  # workers inherit it
    pid_path = None if args.worker else spec.pid
    if pid_path is not None:
        pidfile.check_free(pid_path)  # before anything binds: a second start is refused, not a bind error
    workers = spec.workers or (os.cpu_count() or 1)
    if args.worker or workers == 1:
        return _event_loop_run(_serve(args.config, config, overrides, in_worker=args.worker, pid_path=pid_path))
    from gateway.runtime.listeners import BindFailed, check_bindable
    from gateway.runtime.supervisor import Supervisor

    try:  # the workers bind; the master checks first, so a taken port fails the start, not each worker
        check_bindable(spec.listen)
    except BindFailed as exc:
        errorlog.log.critical("could not start listening: %s", exc)
        return 1
    passthrough: list[str] = []
    for item in args.listen:
        passthrough += ["--listen", item]
    for item in args.upstream:
        passthrough += ["--upstream", item]
    _write_pid(pid_path, args.config)
    try:
        return _event_loop_run(Supervisor(args.config, config, passthrough, workers, overrides).run())
    finally:
        if pid_path is not None:
            pidfile.remove(pid_path)


def _write_pid(path: str | None, config_path: str) -> None:
    """A configured ``pid:`` that cannot be written refuses the start (PidFileError); the default
    one is logged and skipped, as the generated admin token is: the proxy still serves."""
    if path is None:
        return
    try:
        if pidfile.write(path):
            errorlog.log.log(errorlog.NOTICE, "took over the stale pid file %s", path)
    except pidfile.PidFileError as exc:
        if path != default_pid_path(config_path):
            raise
        errorlog.log.error("%s; running without a pid file (set pid: to a path, or pid: off)", exc)


async def _serve(
    config_path: str, config: Any, overrides: Overrides, *, in_worker: bool, pid_path: str | None = None
) -> int:
    from gateway.runtime.server import GatewayServer

    server = GatewayServer(config_path, config, reuse_port=in_worker, overrides=overrides)
    try:
        await server.start()
        _write_pid(pid_path, config_path)
    except (OSError, pidfile.PidFileError, BanStoreError) as exc:
        errorlog.log.critical("could not start listening: %s" if isinstance(exc, OSError) else "%s", exc)
        await server.stop()
        return 1
    if not in_worker:  # systemd's Type=notify: started once it listens (a worker's master says it)
        from gateway.runtime import notify

        notify.ready("serving on " + ", ".join(f"{host}:{port}" for host, port in server.bound_addresses))
    try:
        server.install_signal_handlers()
        if in_worker:
            spawn(_exit_with_parent(server))
        await server.stopped.wait()
    finally:
        if pid_path is not None:
            pidfile.remove(pid_path)
    return 0


async def _exit_with_parent(server: Any) -> None:
    parent = os.getppid()
    while not server.stopped.is_set():
        await asyncio.sleep(1.0)
        if os.getppid() != parent:
            errorlog.log.warning("master process is gone; stopping")
            server.request_stop()
            return


def _demo(args: argparse.Namespace) -> int:
    from gateway.cli.demo import serve
    from gateway.config.reader import host_port

    addresses = [host_port()(a) for a in (args.listen or ["127.0.0.1:9000", "127.0.0.1:9001"])]
    return _event_loop_run(_demo_serve(serve, addresses))


async def _demo_serve(serve: Any, addresses: list[tuple[str, int]]) -> int:
    await serve(addresses)
    return 0
