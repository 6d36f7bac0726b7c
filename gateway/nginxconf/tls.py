"""``ssl_*`` directives: the gateway's keys of the same names, at the same level (http or server)."""

from __future__ import annotations

from gateway.nginxconf.parser import Directive
from gateway.nginxconf.result import Doc, Result

SSL_DIRECTIVES = ("ssl_certificate", "ssl_certificate_key", "ssl_protocols", "ssl_ciphers", "ssl_session_tickets")


def ssl(result: Result, d: Directive, into: Doc) -> None:
    """``ssl_certificate``, ``ssl_certificate_key``, ``ssl_protocols``, ``ssl_ciphers``,
    ``ssl_session_tickets`` into ``into`` (the document or a server's TLS keys)."""
    key = d.name
    if not d.args:
        result.skip(d, f"{key} needs a value")
    elif key in ("ssl_certificate", "ssl_certificate_key") and key in into:
        result.skip(d, f"a second {key} (nginx's RSA + ECDSA pair): the gateway serves one per name")
    elif key in ("ssl_certificate", "ssl_certificate_key") and "$" in d.args[0]:
        result.skip(d, f"{key} with variables: list the certificates in ssl_certificates instead")
    elif key == "ssl_protocols":
        if any(p in ("SSLv2", "SSLv3") for p in d.args):
            result.note(f"{d.where}: ssl_protocols: SSLv2/SSLv3 dropped (Python's ssl has neither)")
        into[key] = " ".join(p for p in d.args if p not in ("SSLv2", "SSLv3")) or "TLSv1.2 TLSv1.3"
    elif key == "ssl_session_tickets":
        into[key] = d.args[0] == "on"
    else:
        into[key] = d.args[0]
