"""``gateway import-nginx``: exit 0 all translated, 2 some directives skipped, 1 a parse error."""

from __future__ import annotations

import os
import sys

from gateway.nginxconf.emit import render
from gateway.nginxconf.parser import ParseError, parse_config
from gateway.nginxconf.translate import Result, translate


def run_import(path: str, output: str | None, emit_future: bool) -> int:
    try:
        directives = parse_config(path)
    except ParseError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 1
    result = translate(directives)
    text = render(result, os.path.basename(path), emit_future)
    for skipped in result.skipped:
        print(f"gateway: skipped: {skipped.line()}", file=sys.stderr)
    for note in result.notes:
        print(f"gateway: note: {note}", file=sys.stderr)
    pending = [] if emit_future else pending_features(result)
    for where, feature in pending:
        print(
            f"gateway: needs {feature}: {where}: written as a comment (--emit-future writes it as a key)",
            file=sys.stderr,
        )
    if output is None or output == "-":
        sys.stdout.write(text)
    else:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    return 2 if result.skipped or pending else 0


def pending_features(result: Result) -> list[tuple[str, str]]:
    """What is written as a ``# needs:`` comment: not active until the feature lands."""
    out: list[tuple[str, str]] = []
    if len(result.servers) > 1:
        out += [(s.where, "servers (virtual hosts)") for s in result.servers]
    for server in result.servers:
        out += [(f.where, f.feature) for route in server.routes for f in route.future]
    return out
