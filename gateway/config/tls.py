"""TLS termination settings (nginx's ``ssl_*`` directives) and loading their certificates.

Keys, at the top level and in a server block (a server's own key wins over the top level's):

* ``ssl_certificate`` / ``ssl_certificate_key``: PEM files (the certificate file may hold
  the chain after the leaf); the certificate served when no ``ssl_certificates`` name matches;
* ``ssl_certificates``: ``[{server_name, certificate, key}]``, certificates chosen by the
  client's SNI name (exact, ``*.example.com``, ``www.example.*``, as ``server_name``);
* ``ssl_protocols``: nginx's names, a list or a space-separated text (default
  ``TLSv1.2 TLSv1.3``); Python's ``ssl`` sets a range, so the names must be contiguous;
* ``ssl_ciphers``: an OpenSSL cipher string for TLS 1.2 and below (default: Mozilla's
  "intermediate" profile, ECDHE with AEAD suites only; nginx's own default,
  ``HIGH:!aNULL:!MD5``, still offers CBC suites and RSA key exchange);
  ``ssl_session_tickets`` (default on).

Certificates are read when the configuration loads (``gateway check`` and every reload),
so a missing file, a key that does not match or a broken PEM is an error naming the key.
Each PEM file (certificate, key, and an upstream's ``tls_ca``) must be a regular file of at
most ``MAX_PEM_BYTES`` (1 MiB: a chain is a few kB, the whole Mozilla CA bundle about 220 kB);
a device, a FIFO or a larger file is refused before it is read (``gateway/files.py``).
"""

from __future__ import annotations

import contextlib
import ssl
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.config.reader import Reader, as_bool, as_str
from gateway.config.servers import ServerName, parse_server_name
from gateway.errors import KeyPath
from gateway.files import MIB, read_bounded

TLS_KEYS = (
    "ssl_certificate",
    "ssl_certificate_key",
    "ssl_certificates",
    "ssl_protocols",
    "ssl_ciphers",
    "ssl_session_tickets",
)
DEFAULT_PROTOCOLS = ("TLSv1.2", "TLSv1.3")
# Mozilla's "intermediate" profile without the DHE suites (they need ssl_dhparam): ECDHE key
# exchange and AEAD ciphers only. TLS 1.3 suites are OpenSSL's, all AEAD.
DEFAULT_CIPHERS = (
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
    "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"
)
_VERSIONS = {
    "TLSv1": ssl.TLSVersion.TLSv1,
    "TLSv1.1": ssl.TLSVersion.TLSv1_1,
    "TLSv1.2": ssl.TLSVersion.TLSv1_2,
    "TLSv1.3": ssl.TLSVersion.TLSv1_3,
}
_ORDER = ("TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3")
MAX_PEM_BYTES = 1 * MIB


@dataclass(frozen=True, slots=True)
class SniCertificate:
    names: tuple[ServerName, ...]
    certificate: str
    key: str
    context: ssl.SSLContext | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsSpec:
    certificate: str | None = None
    key: str | None = None
    protocols: tuple[str, ...] = DEFAULT_PROTOCOLS
    ciphers: str = DEFAULT_CIPHERS
    session_tickets: bool = True
    certificates: tuple[SniCertificate, ...] = ()
    context: ssl.SSLContext | None = field(default=None, compare=False)  # the default certificate, loaded

    @property
    def versions(self) -> tuple[ssl.TLSVersion, ssl.TLSVersion]:
        return _VERSIONS[self.protocols[0]], _VERSIONS[self.protocols[-1]]


def parse_tls(r: Reader, data: dict[str, Any], path: KeyPath, parent: TlsSpec | None = None) -> TlsSpec:
    """The ``ssl_*`` keys of ``data`` (the top level or a server), over ``parent``'s values;
    the certificates are loaded (errors name their key)."""
    base = parent or TlsSpec()
    certificate = r.field(data, "ssl_certificate", path, as_str, None)
    key = r.field(data, "ssl_certificate_key", path, as_str, None)
    own_pair = "ssl_certificate" in data or "ssl_certificate_key" in data
    if ("ssl_certificate" in data) != ("ssl_certificate_key" in data):
        given, missing = (
            ("ssl_certificate", "ssl_certificate_key")
            if "ssl_certificate" in data
            else ("ssl_certificate_key", "ssl_certificate")
        )
        r.error(path + (given,), f"{missing} is required with {given}", at_key=True)
    protocols = r.field(data, "ssl_protocols", path, _protocols, None)
    if protocols is not None and any(p in ("TLSv1", "TLSv1.1") for p in protocols):
        r.warn(path + ("ssl_protocols",), "TLSv1 and TLSv1.1 are obsolete; OpenSSL 3 refuses them at its default level")
    ciphers = r.field(data, "ssl_ciphers", path, _ciphers, None)
    tickets = r.field(data, "ssl_session_tickets", path, _on_off, None)
    spec = TlsSpec(
        certificate=certificate if own_pair else base.certificate,
        key=key if own_pair else base.key,
        protocols=protocols or base.protocols,
        ciphers=ciphers or base.ciphers,
        session_tickets=base.session_tickets if tickets is None else tickets,
    )
    # Protocols, ciphers and tickets act through the listener's context (gateway.edge.tls), so an
    # inherited certificate is not loaded again for them (nor reported twice when it failed).
    context = base.context
    if spec.certificate and spec.key and (own_pair or parent is None):
        at = path + ("ssl_certificate",) if own_pair else ("ssl_certificate",)
        key_at = path + ("ssl_certificate_key",) if own_pair else ("ssl_certificate_key",)
        context = load_context(r, spec, spec.certificate, spec.key, at, key_at)
    sni = base.certificates
    if "ssl_certificates" in data:
        sni = _sni_list(r, data["ssl_certificates"], path + ("ssl_certificates",), spec)
    return replace(spec, certificates=sni, context=context)


def _sni_list(r: Reader, value: Any, path: KeyPath, spec: TlsSpec) -> tuple[SniCertificate, ...]:
    out: list[SniCertificate] = []
    for i, item in enumerate(r.sequence(value, path)):
        ipath = path + (i,)
        keys = ("server_name", "certificate", "key")
        data = r.mapping(item, ipath, keys, required=keys)
        if data is None or not all(k in data for k in keys):
            continue
        names: list[ServerName] = []
        raw = data["server_name"]
        for j, one in enumerate(r.sequence(raw, ipath + ("server_name",), allow_scalar=True)):
            try:
                name = parse_server_name(one)
            except ValueError as exc:
                r.error(ipath + ("server_name", j) if isinstance(raw, list) else ipath + ("server_name",), str(exc))
                continue
            if name.kind == "regex":
                r.error(ipath + ("server_name",), "a certificate's server_name cannot be a regular expression")
                continue
            names.append(name)
        certificate = r.field(data, "certificate", ipath, as_str, None)
        key = r.field(data, "key", ipath, as_str, None)
        if certificate is None or key is None:
            continue
        context = load_context(r, spec, certificate, key, ipath + ("certificate",), ipath + ("key",))
        out.append(SniCertificate(tuple(names), certificate, key, context))
    return tuple(out)


def load_context(
    r: Reader, spec: TlsSpec, certificate: str, key: str, cert_at: KeyPath, key_at: KeyPath
) -> ssl.SSLContext | None:
    """A server-side context with this certificate and key and ``spec``'s protocols; None
    (and an error at the key's path) when a file is missing, unreadable, not PEM, or the key
    is not the certificate's."""
    ok = True
    for file, at, what in ((certificate, cert_at, "certificate"), (key, key_at, "key")):
        try:
            text = read_bounded(file, MAX_PEM_BYTES)
        except OSError as exc:
            r.error(at, f"cannot read the {what} file {file}: {exc.strerror or exc}")
            ok = False
            continue
        marker = b"-----BEGIN CERTIFICATE-----" if what == "certificate" else b"PRIVATE KEY-----"
        if marker not in text:
            r.error(at, f"{file} is not a PEM {what} (no {marker.decode().strip('-')} block)")
            ok = False
    if not ok:
        return None
    context = server_context(spec)
    try:
        context.load_cert_chain(certificate, key)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            r.error(key_at, f"the key in {key} does not match the certificate in {certificate}")
        else:
            r.error(cert_at, f"cannot load {certificate} with the key {key}: {exc.reason or exc}")
        return None
    expiry = _not_after(certificate)
    if expiry is not None and expiry < time.time():
        r.warn(cert_at, f"the certificate in {certificate} expired on {time.strftime('%Y-%m-%d', time.gmtime(expiry))}")
    return context


def server_context(spec: TlsSpec) -> ssl.SSLContext:
    """A server-side context with ``spec``'s protocols, ciphers and tickets (no certificate)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    apply_settings(context, spec)
    return context


def apply_settings(context: ssl.SSLContext, spec: TlsSpec) -> None:
    low, high = spec.versions
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TLSv1 and TLSv1.1, when listed
        context.minimum_version = low
        context.maximum_version = high
    context.set_ciphers(spec.ciphers)
    if spec.session_tickets:
        context.options &= ~ssl.OP_NO_TICKET
    else:
        context.options |= ssl.OP_NO_TICKET


def _not_after(certificate: str) -> float | None:
    decode = getattr(ssl._ssl, "_test_decode_cert", None)  # type: ignore[attr-defined]
    if decode is None:
        return None
    with contextlib.suppress(Exception):
        return float(ssl.cert_time_to_seconds(decode(certificate)["notAfter"]))
    return None


def _protocols(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        names = value.split()
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        names = list(value)
    else:
        raise ValueError("expected protocol names such as TLSv1.2 TLSv1.3 (a list or a space-separated text)")
    if not names:
        raise ValueError("at least one protocol is required")
    for name in names:
        if name in ("SSLv2", "SSLv3"):
            raise ValueError(f"{name} is not supported: Python's ssl (OpenSSL 3) has no {name}; use TLSv1.2 TLSv1.3")
        if name not in _VERSIONS:
            raise ValueError(f"unknown protocol {name!r}: expected TLSv1, TLSv1.1, TLSv1.2 or TLSv1.3")
    ordered = sorted(set(names), key=_ORDER.index)
    first = _ORDER.index(ordered[0])
    if ordered != list(_ORDER[first : first + len(ordered)]):
        raise ValueError(f"protocols must be a contiguous range (Python's ssl sets a minimum and a maximum): {value!r}")
    return tuple(ordered)


def _ciphers(value: Any) -> str:
    text = as_str(value)
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).set_ciphers(text)
    except ssl.SSLError:
        raise ValueError(f"OpenSSL knows no cipher in {text!r}") from None
    return text


def _on_off(value: Any) -> bool:
    if value in ("on", "off"):
        return bool(value == "on")
    return as_bool(value)
