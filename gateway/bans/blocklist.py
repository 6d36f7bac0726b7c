"""The blocklist file format: one IP address or CIDR per line, as public lists publish them.

``#`` and ``;`` start a comment (``1.2.3.0/24 ; SBL123`` is a Spamhaus DROP line); blank
lines are skipped; anything after the first word is ignored. Used by
``gateway ban --file``, ``gateway unban --file`` and ``access.allow_file``/``deny_file``.

A list is bounded, as it is read at each (re)load by every worker and held in each: at
most ``MAX_BYTES`` (16 MiB) and at most ``MAX_ENTRIES`` (1,000,000) lines that are not
blank or comments. Past either the whole list is refused (``FileRefused``, a size at once
from ``stat``), never read by growing. The largest feeds meant for a deny list (Spamhaus
DROP, FireHOL levels 1 to 3, country aggregates, ipsum: up to a few hundred thousand lines,
a few MB) fit many times over; a million entries cost some 250 MB while a load parses them
and about 100 MB in each worker after, which is as far as a proxy should go. A longer list
belongs aggregated into CIDRs, or in the firewall (an ipset or nftables set).
A device or a FIFO is refused before it is opened (``gateway/files.py``).
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field

from gateway.bans.table import canonical_target
from gateway.files import MIB, FileRefused, FileTooLarge, bounded_lines, open_regular, size_text

MAX_ERRORS_SHOWN = 20
MAX_BYTES = 16 * MIB
MAX_ENTRIES = 1_000_000
_AF_INET = socket.AF_INET
_inet_pton = socket.inet_pton
_ADVICE = "aggregate it into CIDRs, or block these addresses in the firewall (ipset, nftables)"


@dataclass(slots=True)
class Blocklist:
    targets: list[tuple[int, str]] = field(default_factory=list)  # (line number, canonical CIDR), no repeats
    errors: list[tuple[int, str]] = field(default_factory=list)  # (line number, what is wrong)


def parse_blocklist(lines: Iterable[str], max_entries: int = MAX_ENTRIES) -> Blocklist:
    """The targets and errors of ``lines``; ``FileRefused`` past ``max_entries`` lines that are not blank."""
    out = Blocklist()
    seen: set[str] = set()
    entries = 0
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].split(";", 1)[0].strip()
        if not text:
            continue
        entries += 1
        if entries > max_entries:
            raise FileRefused(
                f"more than {max_entries:,} entries, the bound for a blocklist (line {number}): {_ADVICE}"
            )
        word = text.split(None, 1)[0]
        try:
            _inet_pton(_AF_INET, word)  # most lines: inet_pton takes only the canonical dotted quad
            target = word + "/32"
        except (OSError, ValueError):
            target = ""
        try:
            target = target or canonical_target(word)
        except ValueError:
            shown = word if len(word) <= 64 and word.isprintable() else repr(word[:64])
            out.errors.append((number, f"not an IP address or CIDR: {shown}"))
            continue
        if target not in seen:
            seen.add(target)
            out.targets.append((number, target))
    return out


def read_blocklist(path: str) -> Blocklist:
    """Read a blocklist file (``-``: stdin) within the bounds; raises OSError (``FileRefused`` past one)."""
    try:
        if path == "-":
            return parse_blocklist(_text(bounded_lines(sys.stdin.buffer, MAX_BYTES)))
        with open_regular(path, MAX_BYTES) as handle:
            return parse_blocklist(_text(bounded_lines(handle, MAX_BYTES)))
    except FileTooLarge:
        raise FileTooLarge(f"larger than {size_text(MAX_BYTES)}, the bound for a blocklist: {_ADVICE}") from None


def _text(lines: Iterable[bytes]) -> Iterable[str]:
    for line in lines:
        yield line.decode("utf-8", "replace")
