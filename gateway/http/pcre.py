"""nginx's regexes (PCRE) in Python's ``re`` spelling: the one translation every regex of the
configuration goes through (rules, map keys, locations, server names), once, when it loads.

Python reads some PCRE constructs differently without an error, so each is translated or refused:

* named groups ``(?<name>...)`` and ``(?'name'...)`` become ``(?P<name>...)``;
* POSIX classes inside a bracket expression (``[[:digit:]]``, ``[^[:space:]]``,
  ``[[:alpha:]_-]``) become their ASCII ranges, as PCRE without UTF mode (nginx's) reads them;
  Python would read ``[[:digit:]]`` as the set ``[:digt`` followed by a ``]``;
* ``[`` inside a class, and a doubled ``&``, ``~``, ``|`` or ``-`` there, are literals in PCRE:
  they are escaped, so Python (which reserves them for nested sets and set operations) reads
  them the same;
* ``\\v`` is PCRE's vertical white space (LF, VT, FF, CR, NEL), only VT in Python;
  ``\\Z`` also matches before a final newline in PCRE;
* refused, as PCRE refuses them too or Python cannot say them: an unknown POSIX class name,
  collating elements (``[.x.]``, ``[=x=]``), a POSIX class outside a bracket expression
  (``[:alpha:]`` alone), and the negated ``[:^name:]`` (write ``[^[:name:]]``).

Escapes Python does not know (``\\Q``, ``\\x{41}``, ``\\h``, ``\\p{L}``...) are errors when the
pattern compiles, never silently different.
"""

from __future__ import annotations

import re
import warnings
from typing import AnyStr

# PCRE's POSIX classes, as PCRE's default ("C" locale) tables have them: ASCII only
POSIX_CLASSES = {
    "alpha": "A-Za-z",
    "digit": "0-9",
    "alnum": "A-Za-z0-9",
    "upper": "A-Z",
    "lower": "a-z",
    "space": "\\t\\n\\x0b\\x0c\\r ",
    "blank": "\\t ",
    "punct": "!-/:-@\\[-`{-~",
    "print": " -~",
    "graph": "!-~",
    "cntrl": "\\x00-\\x1f\\x7f",
    "xdigit": "0-9A-Fa-f",
    "word": "A-Za-z0-9_",
    "ascii": "\\x00-\\x7f",
}
_VERTICAL = "\\n\\x0b\\x0c\\r\\x85"  # PCRE's \v (outside UTF mode)
_NAMED = re.compile(r"\(\?(?:<([A-Za-z_][A-Za-z0-9_]*)>|'([A-Za-z_][A-Za-z0-9_]*)')")


def _posix_end(pattern: str, start: int) -> int:
    """Where the ``:]`` (or ``.]``, ``=]``) ends the POSIX syntax opened at ``start`` (the ``[``),
    or -1 when it is not one (PCRE's check_posix_syntax)."""
    terminator = pattern[start + 1]
    i = start + 2
    while i < len(pattern):
        c = pattern[i]
        nxt = pattern[i + 1] if i + 1 < len(pattern) else ""
        if c == "\\" and nxt in ("]", "\\"):
            i += 2
            continue
        if (c == "[" and nxt == terminator) or c == "]":
            return -1
        if c == terminator and nxt == "]":
            return i + 2
        i += 1
    return -1


def _posix(pattern: str, start: int) -> tuple[str, int] | None:
    """The POSIX item at ``start`` (a ``[`` inside a class) as Python set content, and where it
    ends; None when there is none. ValueError for the forms PCRE or Python cannot say."""
    if start + 1 >= len(pattern) or pattern[start + 1] not in ":.=":
        return None
    end = _posix_end(pattern, start)
    if end < 0:
        return None
    item = pattern[start:end]
    if pattern[start + 1] != ":":
        raise ValueError(f"POSIX collating elements such as {item} are not supported (nor by PCRE)")
    name = item[2:-2]
    if name.startswith("^"):
        raise ValueError(f"the negated POSIX class {item} is not supported: write [^[:{name[1:]}:]] instead")
    if name not in POSIX_CLASSES:
        raise ValueError(f"unknown POSIX class name {item} (PCRE knows {', '.join(POSIX_CLASSES)})")
    return POSIX_CLASSES[name], end


def _escape(pattern: str, i: int, in_class: bool) -> tuple[str, int]:
    """The escape at ``i`` (a backslash) in Python's spelling, and where it ends."""
    pair = pattern[i : i + 2]
    if pair == "\\v":
        return (_VERTICAL if in_class else f"[{_VERTICAL}]"), i + 2
    if pair == "\\Z" and not in_class:
        return "(?=\\n?\\Z)", i + 2
    return pair, i + 2


def _bracket(pattern: str, i: int, out: list[str]) -> int:
    """The bracket expression opened at ``i``, translated into ``out``; where it ends."""
    if pattern[i + 1 : i + 2] in (":", ".", "=") and (end := _posix_end(pattern, i)) > 0:
        raise ValueError(f"POSIX class syntax {pattern[i:end]} is valid only inside a class, such as [[:alpha:]]")
    out.append("[")
    i += 1
    if pattern[i : i + 1] == "^":
        out.append("^")
        i += 1
    if pattern[i : i + 1] == "]":  # a ']' first is a literal in both
        out.append("\\]")
        i += 1
    previous = ""
    while i < len(pattern):
        c = pattern[i]
        if c == "]":
            out.append("]")
            return i + 1
        if c == "\\":
            text, i = _escape(pattern, i, in_class=True)
            out.append(text)
            previous = ""
            continue
        if c == "[":
            posix = _posix(pattern, i)
            if posix is not None:
                out.append(posix[0])
                i = posix[1]
                if pattern[i : i + 1] == "-":  # a literal after a class in PCRE, not a range's
                    out.append("\\-")
                    i += 1
                previous = ""
                continue
            out.append("\\[")
        elif c in "&~|" or (c == "-" and previous == "-"):
            out.append("\\" + c)
        else:
            out.append(c)
        previous = c
        i += 1
    raise ValueError("missing terminating ] for a character class")


def to_python(pattern: str) -> str:
    """``pattern`` (PCRE, as nginx reads it) in Python's ``re`` syntax; ValueError if it cannot be."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            text, i = _escape(pattern, i, in_class=False)
            out.append(text)
        elif c == "[":
            i = _bracket(pattern, i, out)
        elif c == "(" and (m := _NAMED.match(pattern, i)) is not None:
            out.append(f"(?P<{m.group(1) or m.group(2)}>")
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _compile(source: str, pattern: AnyStr, icase: bool) -> re.Pattern[AnyStr]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a FutureWarning: Python would read it differently
            # nginx's PCRE runs without UTF mode: \d, \w, \s, \b and case folding are ASCII only
            flags = (re.IGNORECASE if icase else 0) | (re.ASCII if isinstance(pattern, str) else 0)
            return re.compile(pattern, flags)
    except (re.error, FutureWarning) as exc:
        raise ValueError(f"invalid regular expression {source!r}: {exc}") from None


def _translated(source: str) -> str:
    try:
        return to_python(source)
    except ValueError as exc:
        raise ValueError(f"invalid regular expression {source!r}: {exc}") from None


def compile_pcre(source: str, *, icase: bool) -> re.Pattern[str]:
    """``source`` (PCRE) compiled as Python's ``re``; ValueError says what is wrong with it."""
    return _compile(source, _translated(source), icase)


def compile_pcre_bytes(source: str, *, icase: bool) -> tuple[str, re.Pattern[bytes]]:
    """``source`` (PCRE) in Python's syntax, and compiled to match bytes (a map's keys)."""
    text = _translated(source)
    return text, _compile(source, text.encode("utf-8", "surrogateescape"), icase)
