"""``gateway token``: where the admin token is, and (``--show``) the token; ``--rotate`` replaces it.

With ``admin.token`` set, the token is in the configuration and this command only says so.
Otherwise it is the file ``admin.token_file`` (default ``admin-<port>.token`` in the runtime
directory), which the gateway writes at its first start and keeps across restarts. ``--rotate``
writes a new one there, whether or not the gateway runs: a running gateway takes it at its next
admin call, and the old token stops working then. Prometheus' ``credentials_file`` and the
status page's session need the new one.

    gateway token            the file's path, on stdout
    gateway token --show     the token itself, on stdout (for a script: ``> credentials_file``)
    gateway token --rotate   a new token in the file (with --show, printed too)
"""

from __future__ import annotations

import argparse
import sys

from gateway.admin import token as admin_token
from gateway.config.paths import runtime_dir
from gateway.plan import load_config


def run_token(args: argparse.Namespace) -> int:
    spec = load_config(args.config).spec
    if spec.admin.listen is None:
        print("gateway: the admin API is off (admin.listen: off): there is no admin token", file=sys.stderr)
        return 1
    if spec.admin.token is not None:
        if args.rotate:
            print("gateway: admin.token is set in the configuration: change it there, then restart", file=sys.stderr)
            return 1
        if args.show:
            print(spec.admin.token)
        else:
            print(f"the admin token is admin.token in {spec.file} (gateway token --show prints it)")
        return 0
    path = admin_token.token_path(spec.admin.token_file, spec.admin.listen[1])
    moved = runtime_dir().fallback_reason
    if spec.admin.token_file is None and moved is not None:
        print(f"gateway: note: runtime directory: {moved}: not using it", file=sys.stderr)
    try:
        if args.rotate:
            token = admin_token.rotate(path)
            print(f"gateway: new admin token in {path}; the running gateway takes it at its next call", file=sys.stderr)
        else:
            token = admin_token.read(path)
    except admin_token.TokenFileError as exc:
        print(
            f"gateway: {exc}; the gateway writes the token when it starts (as this user), "
            "or `gateway token --rotate` writes one now",
            file=sys.stderr,
        )
        return 1
    print(token if args.show else path)
    return 0
