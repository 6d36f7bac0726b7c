"""Parsers for the value syntaxes operators know from nginx.

* durations: ``250ms``, ``5s``, ``10m``, ``1h``, ``1d``, ``1h30m``; a bare number is seconds;
* sizes: ``512k``, ``10m``, ``1g``; a bare number is bytes; at most ``MAX_SIZE``
  (1024g) unless the caller sets a lower cap;
* rates: ``10r/s``, ``30r/m``, integer 0 < N <= ``MAX_RATE``, as ``limit_req_zone rate=``.

Digits are ASCII only, like nginx's ``ngx_atoi`` (Python's ``\\d`` would take ``٣``).

Each parser raises ``ValueError`` with a message meant for the operator.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)")
_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
_SIZE = re.compile(r"([0-9]+)([kmg]?)", re.IGNORECASE)
_RATE = re.compile(r"([0-9]+)(?:r/([sm]))?")

MAX_SIZE = 1024**4  # 1024g: no body or zone we could serve is larger; a bigger number is a typo
MAX_RATE = 2**31 - 1  # requests per second or minute: rate_m (N * 1000) stays exact in 42 bits


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
    if re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", text):
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


def parse_size(value: object, maximum: int = MAX_SIZE) -> int:
    """Return a size in bytes (``k`` = 1024, ``m`` = 1024², ``g`` = 1024³), at most ``maximum``."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size such as 512k or 10m, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative, got {value}")
        return _size_at_most(value, maximum, value)
    if not isinstance(value, str):
        raise ValueError(f"expected a size such as 512k or 10m, got {value!r}")
    match = _SIZE.fullmatch(value.strip())
    if match is None:
        raise ValueError(f"invalid size {value!r}: use bytes or a number with k, m or g (e.g. 512k, 10m)")
    digits = match.group(1).lstrip("0") or "0"
    if len(digits) > 20:  # past any cap, and int() refuses over 4300 digits
        raise ValueError(f"size {value!r} is too large: at most {format_size(maximum)}")
    return _size_at_most(int(digits) * _SIZE_UNITS[match.group(2).lower()], maximum, value)


def _size_at_most(size: int, maximum: int, value: object) -> int:
    if size > maximum:
        raise ValueError(f"size {value!r} is too large: at most {format_size(maximum)}")
    return size


def format_size(size: int) -> str:
    """The shortest exact spelling: ``64g``, ``512k``, ``100``."""
    for unit in ("g", "m", "k"):
        if size and size % _SIZE_UNITS[unit] == 0:
            return f"{size // _SIZE_UNITS[unit]}{unit}"
    return str(size)


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
    if isinstance(value, int):
        if value > MAX_RATE:  # before str(): a huge int is slow to print
            raise ValueError(f"rate {value} is too large: at most {MAX_RATE}r/s")
        value = str(value)
    match = _RATE.fullmatch(value.strip())
    if match is None or not match.group(1).strip("0"):
        raise ValueError(
            f"invalid rate {value!r}: use Nr/s or Nr/m with an integer N > 0 "
            "(nginx rejects fractions, 0 and other units)"
        )
    digits, per = match.group(1), match.group(2) or "s"
    if len(digits.lstrip("0")) > len(str(MAX_RATE)) or int(digits) > MAX_RATE:
        raise ValueError(f"rate {value!r} is too large: at most {MAX_RATE}r/{per}")
    count = int(digits)
    scale = 1 if per == "s" else 60
    return Rate(count=count, per=per, rate_m=count * 1000 // scale)


_PERIOD_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PERIOD_RATE = re.compile(r"(\d+)\s*r/([smhd])")


@dataclass(frozen=True, slots=True)
class PeriodRate:
    """``N r/s|r/m|r/h|r/d`` for the gcra, sliding and token zones: N requests per period."""

    count: int
    period_s: int
    text: str

    def __str__(self) -> str:
        return self.text


def parse_period_rate(value: object) -> PeriodRate:
    if isinstance(value, bool) or not isinstance(value, str):
        raise ValueError(f"invalid rate {value!r}: use N r/s, r/m, r/h or r/d with an integer N > 0")
    match = _PERIOD_RATE.fullmatch(value.strip())
    if match is None or len(match.group(1)) > 10 or int(match.group(1)) <= 0:
        raise ValueError(f"invalid rate {value!r}: use N r/s, r/m, r/h or r/d with an integer N > 0")
    count = int(match.group(1))
    return PeriodRate(count=count, period_s=_PERIOD_S[match.group(2)], text=f"{count}r/{match.group(2)}")
