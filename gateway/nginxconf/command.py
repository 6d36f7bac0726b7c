"""``gateway import-nginx``: exit 0 all translated, 2 some directives skipped, 1 a parse error."""

from __future__ import annotations

import os
import sys

from gateway.nginxconf.emit import render
from gateway.nginxconf.parser import ParseError, parse_config
from gateway.nginxconf.translate import translate


def run_import(path: str, output: str | None) -> int:
    try:
        directives = parse_config(path)
    except ParseError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 1
    result = translate(directives)
    text = render(result, os.path.basename(path))
    for skipped in result.skipped:
        print(f"gateway: skipped: {skipped.line()}", file=sys.stderr)
    for note in result.notes:
        print(f"gateway: note: {note}", file=sys.stderr)
    if output is None or output == "-":
        sys.stdout.write(text)
    else:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    return 2 if result.skipped else 0
