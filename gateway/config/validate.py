"""Value checks shared by the configuration and the admin API: admin tokens and loopback hosts."""

from __future__ import annotations

import ipaddress


def is_loopback_host(host: str) -> bool:
    """``localhost``, an address in 127.0.0.0/8, or ``::1`` (a bracketed form is accepted too)."""
    text = host.strip().lower()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if text == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return False
    return ip in ipaddress.ip_network("127.0.0.0/8") if ip.version == 4 else ip == ipaddress.IPv6Address("::1")


def valid_token(token: str) -> bool:
    """A token must fit in a header: visible ASCII, no spaces."""
    return bool(token) and all("!" <= c <= "~" for c in token)
