"""Whatever a configuration file holds, loading it either works or names its errors: never a crash."""

from __future__ import annotations

import os

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config.routes import ROUTE_SETTING_KEYS
from gateway.config.schema import TOP_KEYS
from gateway.config.upstreams import UPSTREAM_KEYS
from gateway.config.zones import ZONE_KEYS
from gateway.errors import ConfigErrors
from gateway.plan import load_config_text

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 10**6),
    st.integers(),  # beyond every cap
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(
        [
            "",
            "10r/s",
            "1.5r/m",
            "5s",
            "10m",
            "abc",
            "$binary_remote_addr",
            "127.0.0.1:9",
            "/",
            "~ (",
            "req",
            "count",
            "conn",
            "app",
            "z",
            "0.0.0.0:99999",
            "[::1]:80",
            "redis://x",
            "off",
            "99999999999999999999r/s",
            "2147483648r/m",
            "1000000g",
            "65g",
            "\u0663r/s",
        ]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
zone_keys = sorted({k for keys in ZONE_KEYS.values() for k in keys})


def mapping_of(keys: list[str]) -> st.SearchStrategy[dict[str, object]]:
    return st.dictionaries(st.sampled_from(keys), values, max_size=len(keys))


limit_entries = st.lists(mapping_of(["zone", "burst", "delay", "nodelay", "max"]) | values, max_size=3)
route_values = st.fixed_dictionaries(
    {},
    optional={
        "location": values,
        "upstream": st.sampled_from(["app", "b", "nope"]) | values,
        "limit_req": limit_entries,
        "limit_count": limit_entries,
        "limit_conn": limit_entries,
        **{k: values for k in ROUTE_SETTING_KEYS if not k.startswith(("limit_req", "limit_count", "limit_conn"))},
    },
)
sections = {
    "store": st.fixed_dictionaries(
        {}, optional={"redis": mapping_of(["url", "cluster", "sentinel", "timeout", "on_error", "prefix", "pool_size"])}
    )
    | values,
    "real_ip": mapping_of(["from", "header", "recursive"]) | values,
    "log": mapping_of(["access", "format", "error", "level"]) | values,
    "admin": mapping_of(["listen", "token"]) | values,
    "access": mapping_of(["allow", "deny"]) | values,
    "bans": mapping_of(["status", "sync_interval"]) | values,
    "defaults": route_values | values,
}
documents = st.fixed_dictionaries(
    {
        "upstreams": st.dictionaries(
            st.sampled_from(["app", "b"]), mapping_of(list(UPSTREAM_KEYS)) | values, max_size=2
        ),
        "zones": st.dictionaries(st.sampled_from(["z", "q"]), mapping_of(zone_keys) | values, max_size=2),
        "routes": st.lists(route_values | values, max_size=3),
    },
    optional={key: sections.get(key, values) for key in TOP_KEYS if key not in ("upstreams", "zones", "routes")},
)


# Reproducible in CI (the same examples every run); exploring new ones on a developer's machine.
@settings(max_examples=600, deadline=None, derandomize=bool(os.environ.get("CI")))
@given(documents)
def test_any_document_loads_or_reports_errors(document):
    text = yaml.safe_dump(document, allow_unicode=True)
    try:
        load_config_text(text, "fuzz.yaml")
    except ConfigErrors as exc:
        assert exc.errors and all(str(e).startswith("fuzz.yaml:") for e in exc.errors)


# YAML's own syntax: anchors, aliases, tags, flow and block collections, control characters.
yaml_text = st.text(alphabet=st.sampled_from(list("[]{}&*!|>-:,'\"#?%@`\\ \t\n\r\x00\x85\ufeffa1é")), max_size=120)


@settings(max_examples=600, deadline=None, derandomize=bool(os.environ.get("CI")))
@given(yaml_text)
def test_any_text_parses_or_reports_errors_with_a_place(text):
    try:
        load_config_text(text, "fuzz.yaml")
    except ConfigErrors as exc:
        assert exc.errors and all(str(e).startswith("fuzz.yaml:") for e in exc.errors)
