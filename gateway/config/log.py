"""``log:``: where the access and error logs go, the access log's format, and the error log's level."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gateway.config.reader import Reader, as_str, one_of
from gateway.errors import KeyPath
from gateway.logs.formats import PRESETS, unknown_variables

LogLevel = Literal["info", "notice", "warn", "error"]
LOG_LEVELS = ("info", "notice", "warn", "error")


@dataclass(frozen=True, slots=True, kw_only=True)
class LogSpec:
    access: str = "stdout"  # stdout | stderr | off | a file path
    format: str = "combined"  # combined | main | json | a template with $variables
    error: str = "stderr"
    level: LogLevel = "notice"


def parse_log(r: Reader, value: Any, path: KeyPath) -> LogSpec:
    data = r.mapping(value, path, ("access", "format", "error", "level"))
    if data is None:
        return LogSpec()
    fmt = r.field(data, "format", path, as_str, "combined") or "combined"
    unknown = unknown_variables(fmt) if fmt not in PRESETS and fmt != "json" else []
    if unknown:
        r.error(path + ("format",), f'unknown log variable "${unknown[0]}"')
    elif fmt not in ("combined", "main", "gateway", "json") and "$" not in fmt:
        r.error(
            path + ("format",),
            f"unknown log format {fmt!r}: use combined, main, gateway, json or a template with $variables",
        )
    return LogSpec(
        access=r.field(data, "access", path, _log_target, "stdout") or "stdout",
        format=fmt,
        error=r.field(data, "error", path, _log_target, "stderr") or "stderr",
        level=r.field(data, "level", path, one_of(*LOG_LEVELS), "notice") or "notice",  # type: ignore[arg-type]
    )


def _log_target(value: Any) -> str:
    if value is False:  # YAML reads a bare `off` as false
        return "off"
    return as_str(value)
