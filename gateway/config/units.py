"""Parsers for the value syntaxes operators know from nginx.

* durations: ``250ms``, ``5s``, ``10m``, ``1h``, ``1d``, ``1h30m``; a bare number is seconds;
* sizes: ``512k``, ``10m``, ``1g``; a bare number is bytes;
* rates: ``10r/s``, ``30r/m``, integer N > 0, exactly as ``limit_req_zone rate=``.

Each parser raises ``ValueError`` with a message meant for the operator.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
_SIZE = re.compile(r"(\d+)([kmg]?)", re.IGNORECASE)


MAX_DURATION_MS = 366 * 86_400_000  # a year: longer is a typo, and would overflow timers


def parse_duration_ms(value: object) -> int:
    """Return a duration in whole milliseconds (0 .. one year)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 5s or 250ms, got {value!r}")
    if isinstance(value, (int, float)):
        if value != value or value < 0:  # NaN or negative
            raise ValueError(f"a duration cannot be negative or NaN, got {value!r}")
        return _bounded(value * 1000, value)
    if not isinstance(value, str):
        raise ValueError(f"expected a duration such as 5s or 250ms, got {value!r}")
    text = value.strip().replace(" ", "")
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return _bounded(float(text) * 1000, value)
    total = 0.0
    pos = 0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNITS_MS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"invalid duration {value!r}: use a number with ms, s, m, h or d (e.g. 5s, 250ms, 1h30m)")
    return _bounded(total, value)


def _bounded(ms: float, value: object) -> int:
    if not ms <= MAX_DURATION_MS:  # also false for inf and NaN
        raise ValueError(f"duration {value!r} is longer than a year")
    return round(ms)


def parse_size(value: object) -> int:
    """Return a size in bytes (``k`` = 1024, ``m`` = 1024², ``g`` = 1024³)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size such as 512k or 10m, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative, got {value}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected a size such as 512k or 10m, got {value!r}")
    match = _SIZE.fullmatch(value.strip())
    if match is None:
        raise ValueError(f"invalid size {value!r}: use bytes or a number with k, m or g (e.g. 512k, 10m)")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]


@dataclass(frozen=True, slots=True)
class Rate:
    """A limit_req rate as nginx stores it.

    ``rate_m`` is milli-requests per second, ``N * 1000 // scale``: so ``1r/m`` is 16,
    not 16.67, exactly like nginx (and lua-resty-redis-ratelimit).
    """

    count: int
    per: str  # "s" or "m"
    rate_m: int

    @property
    def scale(self) -> int:
        return 1 if self.per == "s" else 60

    def __str__(self) -> str:
        return f"{self.count}r/{self.per}"


def parse_rate(value: object) -> Rate:
    """Parse ``Nr/s`` or ``Nr/m`` with nginx's rules (N integer > 0; bare N means r/s)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"invalid rate {value!r}: use Nr/s or Nr/m with an integer N > 0")
    text = str(value).strip()
    per = "s"
    number = text
    if len(text) > 3 and text[-3:] in ("r/s", "r/m"):
        per = text[-1]
        number = text[:-3]
    if not number.isdigit() or int(number) <= 0:
        raise ValueError(
            f"invalid rate {value!r}: use Nr/s or Nr/m with an integer N > 0 "
            "(nginx rejects fractions, 0 and other units)"
        )
    count = int(number)
    scale = 1 if per == "s" else 60
    return Rate(count=count, per=per, rate_m=count * 1000 // scale)
