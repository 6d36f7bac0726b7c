"""``log_format``, ``access_log`` and ``error_log``: the gateway's one access log and one error log (``log:``)."""

from __future__ import annotations

from gateway.logs.formats import PRESETS, unknown_variables
from gateway.nginxconf.parser import Directive
from gateway.nginxconf.result import Doc, Result
from gateway.nginxconf.values import LOG_LEVELS, log_target


class Logs:
    def __init__(self, result: Result) -> None:
        self.result = result
        self.formats: dict[str, tuple[str, Directive]] = {}
        self.log: Doc = {}
        self.http_access: Directive | None = None  # the http-level access_log, which a server's overrides

    def log_format(self, d: Directive) -> None:
        if len(d.args) < 2:
            self.result.skip(d, "log_format needs a name and a format")
            return
        parts = d.args[1:]
        if parts[0].startswith("escape="):
            if parts[0] != "escape=default":
                self.result.skip(
                    d, f"{parts[0]}: the gateway escapes quotes and control bytes as \\xHH (nginx's default)"
                )
            parts = parts[1:]
        self.formats[d.args[0]] = ("".join(parts), d)

    def access_log(self, d: Directive, level: str) -> None:
        """An ``access_log`` at http or (the one) server level; the server's replaces the http one, as in nginx."""
        if level == "server" and self.http_access is not None:
            self.result.skip(self.http_access, f"overridden by the server's access_log ({d.where}), as in nginx")
            self.log.pop("access", None)
            self.log.pop("format", None)
        self._access_log(d)
        if level == "http":
            self.http_access = d

    def _access_log(self, d: Directive) -> None:
        if "access" in self.log:
            self.result.skip(d, "the gateway writes one access log: only the first access_log is used")
            return
        if not d.args:
            self.result.skip(d, "access_log needs a path")
            return
        if d.args[0] == "off":
            self.log["access"] = "off"
            return
        if d.args[0].startswith("syslog:") or len(d.args) > 2:
            self.result.skip(d, "syslog and buffer=/flush=/gzip/if= are not supported: a file, stdout or stderr only")
            return
        name = d.args[1] if len(d.args) > 1 else "combined"
        if name not in ("combined", "main") and name not in self.formats:
            self.result.skip(d, f'nginx: unknown log format "{name}"')
            return
        template = self.formats[name][0] if name in self.formats else name
        unknown = unknown_variables(template) if template not in PRESETS else []
        if unknown:
            self.result.skip(d, f'log_format {name} uses "${unknown[0]}", which the gateway does not log')
            return
        self.log["access"] = log_target(d.args[0])
        self.log["format"] = template

    def error_log(self, d: Directive) -> None:
        if not d.args or d.args[0].startswith(("syslog:", "memory:")) or "error" in self.log:
            self.result.skip(d, "the gateway writes one error log to a file, stdout or stderr")
            return
        level = d.args[1] if len(d.args) > 1 else "error"
        if level not in LOG_LEVELS:
            self.result.skip(d, f"error_log level {level}: the gateway has info, notice, warn and error")
            return
        self.log["error"] = log_target(d.args[0])
        self.log["level"] = level
