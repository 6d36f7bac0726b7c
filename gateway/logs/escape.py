"""Client-supplied text made safe for a log line, the way nginx escapes it.

A quote, a backslash, control bytes and every byte outside printable ASCII are
written as ``\\xHH``, byte by byte of the value's UTF-8 form (bytes that were not
UTF-8 reach us as surrogate escapes and are written as the bytes they were). A
value can then never end a quoted field or forge a new one. A value printed unquoted
(``$remote_user``) has its spaces escaped too, which nginx does not do.
"""

from __future__ import annotations

import re

NEEDS_ESCAPE = re.compile(r"[^\x20\x21\x23-\x5b\x5d-\x7e]")  # not printable ASCII, or " or \
_BYTES = tuple(chr(b) if 0x20 <= b < 0x7F and b not in (0x22, 0x5C) else f"\\x{b:02X}" for b in range(256))


def escape(value: str) -> str:
    if NEEDS_ESCAPE.search(value) is None:
        return value
    return "".join([_BYTES[b] for b in value.encode("utf-8", "surrogateescape")])


NEEDS_ESCAPE_WORD = re.compile(r"[^\x21\x23-\x5b\x5d-\x7e]")  # as NEEDS_ESCAPE, and the space
_WORD_BYTES = tuple("\\x20" if b == 0x20 else c for b, c in enumerate(_BYTES))


def escape_word(value: str) -> str:
    """``escape``, and a space as ``\\x20`` too: for a value a log prints unquoted (``$remote_user``),
    where a space would start a field of the client's making."""
    if NEEDS_ESCAPE_WORD.search(value) is None:
        return value
    return "".join([_WORD_BYTES[b] for b in value.encode("utf-8", "surrogateescape")])
