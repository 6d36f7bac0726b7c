"""``routes:`` and ``defaults:``: each route's location, its upstream or ``return``, its guard
``rules`` (nginx's ``if (...) { return ...; }``), and the settings a route may set itself or
inherit from ``defaults`` (body limits, buffering, headers, and the zones it uses: ``limits``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.config.access import parse_access_rules
from gateway.config.limits import (
    LimitConnSpec,
    LimitCountSpec,
    LimitReqSpec,
    LimitUseSpec,
    no_zone_twice,
    parse_limit_conn,
    parse_limit_count,
    parse_limit_req,
    parse_limits,
)
from gateway.config.log import LOG_LEVELS, LogLevel
from gateway.config.reader import (
    Reader,
    as_bool,
    as_str,
    duration_ms,
    int_in,
    one_of,
    positive_duration_ms,
    size,
    status_code,
)
from gateway.config.upstreams import UpstreamSpec
from gateway.config.zones import ZoneSpec
from gateway.errors import KeyPath
from gateway.http.access import AccessRule
from gateway.http.routing import Location, parse_location
from gateway.http.rules import Condition, parse_condition
from gateway.http.templates import ValueTemplate, parse_body_text, parse_value


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteSettings:
    """Settings a route may set itself or inherit from ``defaults`` (None = not set here)."""

    upstream: str | None = None
    client_max_body_size: int | None = None
    client_body_timeout_ms: int | None = None
    limit_req: tuple[LimitReqSpec, ...] | None = None
    limit_count: tuple[LimitCountSpec, ...] | None = None
    limit_conn: tuple[LimitConnSpec, ...] | None = None
    limits: tuple[LimitUseSpec, ...] | None = None
    limit_req_status: int | None = None
    limit_conn_status: int | None = None
    limit_count_status: int | None = None
    limit_req_log_level: LogLevel | None = None
    limit_conn_log_level: LogLevel | None = None
    dry_run: bool | None = None
    ratelimit_headers: bool | None = None
    proxy_request_buffering: bool | None = None
    client_body_buffer_size: int | None = None
    client_body_deadline_ms: int | None = None
    proxy_buffering: bool | None = None
    proxy_buffers: int | None = None
    proxy_max_temp_file_size: int | None = None
    proxy_set_header: tuple[tuple[str, ValueTemplate], ...] | None = None  # empty value: remove the header
    add_header: tuple[AddHeaderSpec, ...] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AddHeaderSpec:
    name: str
    value: ValueTemplate
    always: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ReturnSpec:
    code: int
    url: ValueTemplate | None = None  # 301, 302, 303, 307, 308
    text: ValueTemplate | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RuleSpec:
    """``{if: CONDITION, return: ...}``: nginx's ``if (CONDITION) { return ...; }``."""

    condition: Condition
    ret: ReturnSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteSpec:
    index: int
    location: Location
    settings: RouteSettings
    uri: str | None = None  # proxy_pass's URI part: replaces the matched prefix
    ret: ReturnSpec | None = None  # answer at once, no upstream
    rules: tuple[RuleSpec, ...] = ()  # run in order before the limits (and before ret)
    access: tuple[AccessRule, ...] | None = None  # its own allow/deny list (None: the server's)


ROUTE_SETTING_KEYS = (
    "upstream",
    "client_max_body_size",
    "client_body_timeout",
    "limit_req",
    "limit_count",
    "limit_conn",
    "limits",
    "limit_req_status",
    "limit_conn_status",
    "limit_count_status",
    "limit_req_log_level",
    "limit_conn_log_level",
    "dry_run",
    "ratelimit_headers",
    "proxy_request_buffering",
    "client_body_buffer_size",
    "client_body_deadline",
    "proxy_buffering",
    "proxy_buffers",
    "proxy_max_temp_file_size",
    "proxy_set_header",
    "add_header",
)
ROUTE_ONLY_KEYS = ("location", "uri", "return", "rules", "access")
REDIRECT_CODES = (301, 302, 303, 307, 308)


def parse_routes(
    r: Reader,
    value: Any,
    zones: Mapping[str, ZoneSpec],
    upstreams: Mapping[str, UpstreamSpec],
    defaults: RouteSettings,
    at: KeyPath = ("routes",),
) -> tuple[RouteSpec, ...]:
    items = r.sequence(value, at)
    out: list[RouteSpec] = []
    seen: dict[tuple[str, str], int] = {}
    for i, item in enumerate(items):
        path: KeyPath = at + (i,)
        data = r.mapping(item, path, ROUTE_ONLY_KEYS + ROUTE_SETTING_KEYS, required=("location",))
        if data is None or "location" not in data:
            continue
        location = r.field(data, "location", path, parse_location)
        settings = parse_settings(r, data, path, zones, upstreams, allowed=None)
        if location is None:
            continue
        ident = (location.kind if location.kind != "prefix_noregex" else "prefix", location.value)
        if ident in seen:
            r.error(path + ("location",), f'duplicate location "{location.value}" (first at {at[-1]}[{seen[ident]}])')
        seen[ident] = i
        ret = parse_return(r, data["return"], path + ("return",)) if "return" in data else None
        rules = parse_rules(r, data["rules"], path + ("rules",)) if "rules" in data else ()
        access = parse_access_rules(r, data["access"], path + ("access",)) if "access" in data else None
        uri = r.field(data, "uri", path, _uri, None)
        if uri is not None and location.kind in ("regex", "regex_icase"):
            r.error(path + ("uri",), "a uri cannot be given for a location given by regular expression (as in nginx)")
        if ret is not None and (uri is not None or settings.upstream is not None):
            r.error(path + ("return",), "a route with return answers itself: it has no upstream nor uri")
        if "return" not in data and settings.upstream is None and defaults.upstream is None:
            r.error(path, "missing required key 'upstream' (set it here or in defaults)")
        out.append(
            RouteSpec(index=i, location=location, settings=settings, uri=uri, ret=ret, rules=rules, access=access)
        )
    if isinstance(value, list) and not items:
        r.error(at, "at least one route is required")
    return tuple(out)


def parse_settings(
    r: Reader,
    data: Any,
    path: KeyPath,
    zones: Mapping[str, ZoneSpec],
    upstreams: Mapping[str, UpstreamSpec],
    allowed: tuple[str, ...] | None,
) -> RouteSettings:
    if allowed is not None:
        data = r.mapping(data, path, allowed)
        if data is None:
            return RouteSettings()
    upstream = r.field(data, "upstream", path, as_str, None)
    if upstream is not None and upstream not in upstreams:
        r.error(path + ("upstream",), f'unknown upstream "{upstream}"')
    if isinstance(data.get("limits"), list):
        no_zone_twice(r, data, path)
    return RouteSettings(
        upstream=upstream,
        client_max_body_size=r.field(data, "client_max_body_size", path, size, None),
        client_body_timeout_ms=r.field(data, "client_body_timeout", path, positive_duration_ms, None),
        limit_req=parse_limit_req(r, data["limit_req"], path + ("limit_req",), zones) if "limit_req" in data else None,
        limit_count=parse_limit_count(r, data["limit_count"], path + ("limit_count",), zones)
        if "limit_count" in data
        else None,
        limit_conn=parse_limit_conn(r, data["limit_conn"], path + ("limit_conn",), zones)
        if "limit_conn" in data
        else None,
        limits=parse_limits(r, data["limits"], path + ("limits",), zones) if "limits" in data else None,
        limit_req_status=r.field(data, "limit_req_status", path, status_code, None),
        limit_conn_status=r.field(data, "limit_conn_status", path, status_code, None),
        limit_count_status=r.field(data, "limit_count_status", path, status_code, None),
        limit_req_log_level=r.field(data, "limit_req_log_level", path, one_of(*LOG_LEVELS), None),  # type: ignore[arg-type]
        limit_conn_log_level=r.field(data, "limit_conn_log_level", path, one_of(*LOG_LEVELS), None),  # type: ignore[arg-type]
        dry_run=r.field(data, "dry_run", path, as_bool, None),
        ratelimit_headers=r.field(data, "ratelimit_headers", path, as_bool, None),
        proxy_request_buffering=r.field(data, "proxy_request_buffering", path, _on_off, None),
        client_body_buffer_size=r.field(data, "client_body_buffer_size", path, size, None),
        client_body_deadline_ms=r.field(data, "client_body_deadline", path, duration_ms, None),
        proxy_buffering=r.field(data, "proxy_buffering", path, _on_off, None),
        proxy_buffers=r.field(data, "proxy_buffers", path, _proxy_buffers, None),
        proxy_max_temp_file_size=r.field(data, "proxy_max_temp_file_size", path, size, None),
        proxy_set_header=_proxy_set_header(r, data["proxy_set_header"], path + ("proxy_set_header",))
        if "proxy_set_header" in data
        else None,
        add_header=_add_header(r, data["add_header"], path + ("add_header",)) if "add_header" in data else None,
    )


def _uri(value: Any) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise ValueError(f"expected a URI path starting with '/', such as /v1/, got {value!r}")
    if any(c <= " " or c == "\x7f" for c in value) or "$" in value or "#" in value:
        raise ValueError("a uri cannot contain spaces, control characters, '#' or variables")
    return value


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def _header_name(value: Any) -> str:
    if not isinstance(value, str) or not _TOKEN.fullmatch(value):
        raise ValueError(f"expected a header name (an HTTP token), got {value!r}")
    return value


def _proxy_set_header(r: Reader, value: Any, path: KeyPath) -> tuple[tuple[str, ValueTemplate], ...]:
    if not isinstance(value, dict):
        r.error(path, "expected a mapping of header names to values (an empty value removes the header)")
        return ()
    out: list[tuple[str, ValueTemplate]] = []
    for name, text in value.items():
        try:
            out.append((_header_name(name), parse_value("" if text is None else text, defined=r.defined)))
        except ValueError as exc:
            r.error(path + (str(name),), str(exc))
    return tuple(out)


def _add_header(r: Reader, value: Any, path: KeyPath) -> tuple[AddHeaderSpec, ...]:
    out: list[AddHeaderSpec] = []
    for i, item in enumerate(r.sequence(value, path)):
        data = r.mapping(item, path + (i,), ("name", "value", "always"), required=("name", "value"))
        if data is None or "name" not in data or "value" not in data:
            continue
        name = r.field(data, "name", path + (i,), _header_name, None)
        text = r.field(data, "value", path + (i,), lambda v: parse_value(v, defined=r.defined), None)
        always = r.field(data, "always", path + (i,), as_bool, False)
        if name is not None and text is not None:
            out.append(AddHeaderSpec(name=name, value=text, always=bool(always)))
    return tuple(out)


def parse_rules(r: Reader, value: Any, path: KeyPath) -> tuple[RuleSpec, ...]:
    """``rules: [{if: '$request_method !~ ^(GET|HEAD)$', return: 405}, ...]``, in order."""
    out: list[RuleSpec] = []
    for i, item in enumerate(r.sequence(value, path)):
        at = path + (i,)
        data = r.mapping(item, at, ("if", "return"), required=("if", "return"))
        if data is None or "if" not in data or "return" not in data:
            continue
        condition = r.field(data, "if", at, lambda v: parse_condition(v, r.defined), None)
        ret = parse_return(r, data["return"], at + ("return",))
        if condition is not None and ret is not None:
            out.append(RuleSpec(condition=condition, ret=ret))
    return tuple(out)


def parse_return(r: Reader, value: Any, path: KeyPath) -> ReturnSpec | None:
    """``{code: N, url: ...}``, ``{code: N, text: ...}``, ``{code: N}``, or the code alone (``403``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = {"code": value}
    data = r.mapping(value, path, ("code", "url", "text"), required=("code",))
    if data is None or "code" not in data:
        return None
    code = r.field(data, "code", path, int_in(200, 599, "status code"), None)
    url = r.field(data, "url", path, lambda v: parse_value(v, defined=r.defined), None)
    text = r.field(data, "text", path, lambda v: parse_body_text(v, r.defined), None)
    if code is None:
        return None
    if url is not None and code not in REDIRECT_CODES:
        r.error(path + ("url",), f"url goes with a redirect code ({', '.join(map(str, REDIRECT_CODES))}), not {code}")
        return None
    if code in REDIRECT_CODES and url is None:
        r.error(path, f"a {code} return needs a url")
        return None
    if url is not None and text is not None:
        r.error(path, "a return has a url or a text, not both")
        return None
    return ReturnSpec(code=code, url=url, text=text)


def _on_off(value: Any) -> bool:
    """nginx's on|off (YAML reads bare on/off as booleans already)."""
    if value in ("on", "off"):
        return bool(value == "on")
    if not isinstance(value, bool):
        raise ValueError(f"expected on or off, got {value!r}")
    return value


def _proxy_buffers(value: Any) -> int:
    """Bytes of memory for one response: a size (``64k``) or nginx's ``number size`` (``8 8k``)."""
    if isinstance(value, str) and len(value.split()) == 2:
        count, each = value.split()
        if not count.isdigit():
            raise ValueError(f"invalid proxy_buffers {value!r}: use a size (64k) or a number and a size (8 8k)")
        total = int(count) * size(each)
    else:
        total = size(value)
    if total <= 0:
        raise ValueError("proxy_buffers must be more than 0 bytes")
    return total
