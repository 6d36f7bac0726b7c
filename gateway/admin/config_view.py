"""The configuration in force as plain JSON data, secrets redacted: what ``GET /config`` shows.

Every frozen spec object becomes an object of its fields, mappings objects, tuples
lists; anything else (compiled templates, networks, rates) its text. Redacted:

* the value of every field or key whose name says token, password, passwd or secret
  (admin.token, the Sentinel passwords, ...);
* the credentials of any URL (``redis://user:pass@host`` -> ``redis://REDACTED@host``)
  and a ``password=`` / ``token=`` query parameter.

File paths (TLS key files, token_file) are shown; contents never are.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

REDACTED = "REDACTED"
_SECRET_NAME = re.compile(r"token|passw(or)?d|secret", re.IGNORECASE)
_PATH_NAME = re.compile(r"_file$|_path$|^file$")  # a path to a secret is not the secret
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@")
_QUERY_SECRET = re.compile(r"(?P<key>[?&](?:password|token|secret)=)[^&#\s]*", re.IGNORECASE)


def config_view(spec: Any) -> Any:
    """``spec`` (a ConfigSpec) as JSON-ready data with the secrets redacted."""
    return _plain(spec)


def _plain(value: Any, name: str = "") -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    if name and _SECRET_NAME.search(name) and not _PATH_NAME.search(name):
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
    text = getattr(value, "source", None)
    if isinstance(text, str):  # a compiled template: its text as written
        return redact_text(text)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        named = getattr(value, "name", None)  # {name, value}: a header, whose name says if the value is secret
        return {
            f.name: _plain(getattr(value, f.name), named if f.name == "value" and isinstance(named, str) else f.name)
            for f in dataclasses.fields(value)
        }
    if isinstance(value, Mapping):
        # a key names a user-chosen thing (a zone, an upstream) or a header: only a text value is a secret
        return {str(k): _plain(v, str(k) if isinstance(v, str) else "") for k, v in value.items()}
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) and not isinstance(value[1], int):
        return [value[0], _plain(value[1], value[0])]  # a (header name, value) pair
    if isinstance(value, tuple | list | frozenset | set):
        return [_plain(v) for v in value]
    return redact_text(str(value))


def redact_text(text: str) -> str:
    text = _URL_CREDENTIALS.sub(lambda m: m.group("scheme") + REDACTED + "@", text)
    return _QUERY_SECRET.sub(lambda m: m.group("key") + REDACTED, text)
