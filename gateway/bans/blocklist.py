"""The blocklist file format: one IP address or CIDR per line, as public lists publish them.

``#`` and ``;`` start a comment (``1.2.3.0/24 ; SBL123`` is a Spamhaus DROP line); blank
lines are skipped; anything after the first word is ignored. Used by
``gateway ban --file``, ``gateway unban --file`` and ``access.allow_file``/``deny_file``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gateway.bans.table import canonical_target

MAX_ERRORS_SHOWN = 20


@dataclass(slots=True)
class Blocklist:
    targets: list[tuple[int, str]] = field(default_factory=list)  # (line number, canonical CIDR), no repeats
    errors: list[tuple[int, str]] = field(default_factory=list)  # (line number, what is wrong)


def parse_blocklist(lines: Iterable[str]) -> Blocklist:
    out = Blocklist()
    seen: set[str] = set()
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].split(";", 1)[0].strip()
        if not text:
            continue
        word = text.split(None, 1)[0]
        try:
            target = canonical_target(word)
        except ValueError:
            shown = word if len(word) <= 64 and word.isprintable() else repr(word[:64])
            out.errors.append((number, f"not an IP address or CIDR: {shown}"))
            continue
        if target not in seen:
            seen.add(target)
            out.targets.append((number, target))
    return out


def read_blocklist(path: str) -> Blocklist:
    """Read a blocklist file (``-``: stdin); raises OSError."""
    if path == "-":
        import sys

        return parse_blocklist(sys.stdin)
    with open(path, encoding="utf-8", errors="replace") as handle:
        return parse_blocklist(handle)
