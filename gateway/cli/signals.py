"""``gateway stop`` and the signal form of ``gateway reload``: the process found through its pid file.

    gateway stop   [-c conf | --pid FILE] [--timeout 60s]   like nginx -s quit: SIGTERM, then wait
    gateway reload --pid FILE                              SIGHUP (the admin API form reports errors)

The pid file comes from ``--pid``, or from the config's ``pid:`` (its default when the
config cannot be loaded, so a config broken by an edit can still stop the gateway).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from gateway.config.paths import default_path as default_pid_path
from gateway.config.units import parse_duration_ms
from gateway.errors import ConfigErrors, GatewayError
from gateway.plan import load_config
from gateway.runtime import pidfile


def pid_path_of(args: argparse.Namespace) -> str:
    if getattr(args, "pid", None):
        return os.path.abspath(str(args.pid))
    try:
        spec = load_config(args.config).spec
    except ConfigErrors as exc:
        print(f"gateway: warning: {exc.errors[0]}; using the default pid file", file=sys.stderr)
        return default_pid_path(args.config)
    if spec.pid is None:
        raise GatewayError(f"{args.config}: pid is off; give --pid FILE")
    return spec.pid


def run_stop(args: argparse.Namespace) -> int:
    try:
        timeout_s = parse_duration_ms(args.timeout) / 1000
    except ValueError as exc:
        raise GatewayError(f"stop --timeout: {exc}") from None
    path = pid_path_of(args)
    pid = pidfile.running(path)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while pidfile.is_gateway(pid):
        if time.monotonic() >= deadline:
            print(f"gateway: pid {pid} is still running after {args.timeout} (draining requests?)", file=sys.stderr)
            return 1
        time.sleep(0.1)
    print(f"stopped (pid {pid})")
    return 0


def signal_reload(args: argparse.Namespace) -> int:
    path = pid_path_of(args)
    pid = pidfile.running(path)
    os.kill(pid, signal.SIGHUP)
    print(f"sent SIGHUP to pid {pid}: the error log says whether the reload succeeded")
    return 0
