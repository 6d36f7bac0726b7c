"""Every configuration key the schema accepts is named in docs/configuration.md, and every key
that page's tables name is accepted.

The accepted keys are collected from the parser itself rather than copied: every section's
parser checks its mapping with ``Reader.mapping(value, path, allowed, ...)``, so the test
records each call's ``allowed`` keys while a configuration that uses every section is parsed.
A call site that configuration did not reach would hide its keys, so the test also finds every
``.mapping(`` call in ``gateway/config/`` and fails when one was not reached. Zone types and
their per-use keys are chosen by type inside one call site, so their tables (``ZONE_KEYS``,
``LIMIT_USE_KEYS``) are imported and added whole.
"""

from __future__ import annotations

import ast
import contextlib
import datetime
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gateway.config.reader import Reader
from gateway.config.schema import parse_config
from gateway.config.source import parse_yaml
from gateway.config.zones import LIMIT_USE_KEYS, ZONE_KEYS
from gateway.errors import ConfigErrors

ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = ROOT / "gateway" / "config"
REFERENCE = ROOT / "docs" / "configuration.md"


def _write_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate and its key (the TLS keys' parser loads them)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "docs.test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "site.crt", directory / "site.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def _every_section(tmp: Path) -> str:
    """A configuration that reaches every section's parser (valid or not: only the keys matter)."""
    cert, key = _write_certificate(tmp)
    (tmp / "allow.txt").write_text("10.1.0.0/16\n")
    (tmp / "deny.txt").write_text("192.0.2.0/24\n")
    zones = "\n".join(
        f"  z_{ztype}: {{type: {ztype}, key: $binary_remote_addr"
        + {
            "req": ", rate: 10r/s",
            "count": ", limit: 10, window: 60s",
            "conn": "",
            "gcra": ", rate: 10r/s",
            "sliding_log": ", limit: 10, window: 60s",
            "token": ", rate: 10r/s",
        }.get(ztype, "")
        + "}"
        for ztype in ZONE_KEYS
    )
    uses = ", ".join(
        f"{{zone: z_{ztype}, max: 5}}" if ztype == "conn" else f"{{zone: z_{ztype}}}" for ztype in ZONE_KEYS
    )
    return (
        textwrap.dedent(
            f"""\
        listen: [{{address: 127.0.0.1:8443, ssl: true}}, 127.0.0.1:8080]
        ssl_certificate: {cert}
        ssl_certificate_key: {key}
        ssl_certificates: [{{server_name: docs.test, certificate: {cert}, key: {key}}}]
        log: {{access: off, format: combined, error: stderr, level: notice}}
        admin: {{listen: 127.0.0.1:9180}}
        metrics: {{listen: 127.0.0.1:9145}}
        real_ip: {{from: [10.0.0.0/8], header: X-Forwarded-For, recursive: true}}
        access: {{allow: [10.0.0.0/8], deny: [192.0.2.0/24], allow_file: {tmp}/allow.txt, deny_file: {tmp}/deny.txt,
                 rules: [{{deny: 198.51.100.0/24}}]}}
        bans: {{status: 403, sync_interval: 5s}}
        store:
          redis:
            sentinel: {{master: m, nodes: [127.0.0.1:26379]}}
        upstreams:
          app:
            servers: [{{address: 127.0.0.1:9000, weight: 1}}]
            scheme: https
            tls_ca: {cert}
        maps:
          m: {{source: $uri, default: x, hostnames: false, values: {{a: b}}}}
        geo:
          g: {{source: $remote_addr, default: x, ranges: false, values: {{10.0.0.0/8: y}}}}
        zones:
        """
        )
        + zones
        + textwrap.dedent(
            f"""
        defaults:
          limit_req_status: 429
        servers:
          - server_name: docs.test
            rules: [{{if: "$request_method = TRACE", return: 405}}]
            access: [{{allow: 10.0.0.0/8}}, {{deny: all}}]
            routes:
              - location: /
                upstream: app
                limit_req: [{{zone: z_req}}]
                limit_count: [{{zone: z_count}}]
                limit_conn: [{{zone: z_conn, max: 5}}]
                add_header: [{{name: X-A, value: b}}]
              - location: /all
                upstream: app
                limits: [{uses}]
                access: [{{allow: all}}]
              - location: = /old
                return: {{code: 301, url: "https://example.com/"}}
                rules: [{{if: $arg_x, return: {{code: 403}}}}]
        """
        )
    )


def _mapping_call_sites() -> set[tuple[str, int, int]]:
    """(file, first line, last line) of every ``<x>.mapping(`` call in gateway/config/."""
    sites = set()
    for path in CONFIG_DIR.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "mapping":
                sites.add((str(path.resolve()), node.lineno, node.end_lineno or node.lineno))
    return sites


def accepted_keys(tmp: Path) -> dict[str, set[str]]:
    """Every key the schema accepts, with the places (key paths) it is accepted at."""
    seen_sites: set[tuple[str, int]] = set()
    keys: dict[str, set[str]] = {}
    original = Reader.mapping

    def recording(self: Reader, value: Any, path: Any, allowed: Any, *args: Any, **kwargs: Any) -> Any:
        allowed = tuple(allowed)
        caller = sys._getframe(1)
        seen_sites.add((str(Path(caller.f_code.co_filename).resolve()), caller.f_lineno))
        where = ".".join("[]" if isinstance(p, int) else str(p) for p in path) or "(top level)"
        for key in allowed:
            keys.setdefault(key, set()).add(where)
        return original(self, value, path, allowed, *args, **kwargs)

    Reader.mapping = recording  # type: ignore[method-assign]
    try:
        with contextlib.suppress(ConfigErrors):  # the sample need not be valid: the parsers ran
            parse_config(parse_yaml(_every_section(tmp), str(tmp / "every.yaml")))
    finally:
        Reader.mapping = original  # type: ignore[method-assign]

    missed = [
        (file, first)
        for file, first, last in _mapping_call_sites()
        if not any(f == file and first <= line <= last for f, line in seen_sites)
    ]
    assert not missed, f"the sample configuration did not reach these Reader.mapping calls: {sorted(missed)}"
    for ztype, zone_keys in ZONE_KEYS.items():
        for key in zone_keys:
            keys.setdefault(key, set()).add(f"zones.<{ztype} zone>")
    for ztype, use_keys in LIMIT_USE_KEYS.items():
        for key in use_keys:
            keys.setdefault(key, set()).add(f"limits[] of a {ztype} zone")
    return keys


def _named(key: str, text: str) -> bool:
    """`key`, or a dotted name ending in it (`log.access`), or starting with it (`log.access` names log)."""
    return f"`{key}`" in text or f".{key}`" in text or f"]{key}`" in text or f"`{key}." in text


def _named_in_tables(text: str) -> set[str]:
    """Keys in the first column of the page's tables: `a.b[].c` gives c; `x`, `y` gives both."""
    names = set()
    for line in text.splitlines():
        if not line.startswith("| `"):
            continue
        first = line.split("|")[1]
        for item in re.findall(r"`([^`]+)`", first):
            names.add(re.split(r"[.\]]", item)[-1])
    return names


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    return accepted_keys(tmp_path_factory.mktemp("every-section"))


def test_every_accepted_key_is_in_the_configuration_reference(keys: dict[str, set[str]]) -> None:
    text = REFERENCE.read_text()
    missing = {key: sorted(where) for key, where in keys.items() if not _named(key, text)}
    assert not missing, f"keys the schema accepts but {REFERENCE.name} does not name: {missing}"


def test_the_reference_tables_name_only_accepted_keys(keys: dict[str, set[str]]) -> None:
    unknown = _named_in_tables(REFERENCE.read_text()) - set(keys)
    assert not unknown, f"{REFERENCE.name} documents keys the schema does not accept: {sorted(unknown)}"


def test_the_sample_reaches_a_known_key_of_each_section(keys: dict[str, set[str]]) -> None:
    """A guard on the recorder itself: a few keys from different parsers are there."""
    for key in ("listen", "server_name", "sentinel_password", "fail_timeout", "always", "token_file", "window_type"):
        assert key in keys
