"""``gateway import-nginx``: exit 0 all translated, 2 some directives skipped, 1 nothing that runs.

Exit 1 says why in one line (the last on stderr): a parse error, nothing proxied, or a
translation that would not pass ``gateway check``, which is run here on the output before
it is written, so that what is written is a configuration that runs.
"""

from __future__ import annotations

import os
import sys

from gateway.errors import ConfigErrors
from gateway.nginxconf.emit import render
from gateway.nginxconf.parser import ParseError, parse_config_noting
from gateway.nginxconf.translate import translate
from gateway.plan.load import load_config_text


def run_import(path: str, output: str | None, allow_open: bool = False) -> int:
    try:
        directives, found = parse_config_noting(path)
    except ParseError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 1
    result = translate(directives, allow_open=allow_open)
    result.notes[:0] = found
    for skipped in result.skipped:
        print(f"gateway: skipped: {skipped.line()}", file=sys.stderr)
    for note in result.notes:
        print(f"gateway: note: {note}", file=sys.stderr)
    for refused in result.refused:
        print(f"gateway: fail closed: {refused}", file=sys.stderr)
    if result.same:
        print(f"gateway: same as nginx here: {result.same_line()}", file=sys.stderr)
    if result.fatal:
        print(f"gateway: {path}: {result.fatal}", file=sys.stderr)
        return 1
    text = render(result, os.path.basename(path))
    try:
        load_config_text(text, output if output and output != "-" else "<import-nginx>")
    except ConfigErrors as exc:
        first = str(exc.errors[0]).replace("\n", " ") if exc.errors else str(exc)
        print(f"gateway: {path}: the translation would not pass gateway check: {first}", file=sys.stderr)
        return 1
    if output is None or output == "-":
        sys.stdout.write(text)
    else:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    return 2 if result.skipped else 0
