"""The last pass of a translation: what is left must be a configuration that runs.

A server with no route is left out; a listen with ``ssl`` needs a certificate and a key the
gateway can read here (``gateway check`` reads them), else that listen is left out; a
certificate at the top level that cannot be read is left out. When no server is left,
``Result.fatal`` says in one line why, and the import exits 1.
"""

from __future__ import annotations

from gateway.nginxconf.locations import NON_HTTP_CONTENT
from gateway.nginxconf.parser import Directive
from gateway.nginxconf.result import Result, Server

CERT_KEYS = ("ssl_certificate", "ssl_certificate_key")


def finish(result: Result, directives: list[Directive]) -> None:
    if result.listen_no_ops:
        result.note(
            f"listen {' '.join(sorted(result.listen_no_ops))}: socket tuning accepted as is "
            "(the gateway sets SO_REUSEPORT and its own backlog)"
        )
    _top_level_certificate(result)
    kept: list[Server] = []
    before = len(result.skipped)
    for srv in result.servers:
        if not srv.routes:
            result.skipped_server(srv, "nothing is proxied in this server (no location with proxy_pass or return)")
            continue
        _tls(result, srv)
        if not srv.listen:
            continue
        kept.append(srv)
    result.servers = kept
    result.refused = [
        f"location {r.data['location']}: {c}"
        for srv in kept
        for r in srv.routes
        for c in r.comments
        if c.startswith("refuses every request")
    ]
    proxied = any("upstream" in r.data for srv in kept for r in srv.routes)
    if not kept:
        result.fatal = _why_nothing(directives, [s.reason for s in result.skipped[before:]])
    elif not proxied and result.non_http:
        result.fatal = "nothing is proxied: this configuration serves files or FastCGI/uwsgi only"


def _unreadable(path: str) -> str:
    """Why the gateway cannot read ``path`` here ("" if it can)."""
    try:
        with open(path, "rb"):
            return ""
    except OSError as exc:
        return f"cannot read {path} here ({exc.strerror or exc})"


def _top_level_certificate(result: Result) -> None:
    doc = result.doc
    present = [k for k in CERT_KEYS if k in doc]
    problem = ""
    if len(present) == 1:
        problem = f"{present[0]} without {CERT_KEYS[1 - CERT_KEYS.index(present[0])]}"
    elif present:
        problem = next((p for p in (_unreadable(doc[k]) for k in CERT_KEYS) if p), "")
    if problem:
        for k in present:
            result.dropped_key(f"http-level {k} {doc.pop(k)}", problem)


def _tls(result: Result, srv: Server) -> None:
    """The server's ssl listens, kept only with a certificate and key the gateway can read."""
    if not any(entry.endswith(" ssl") for entry in srv.listen):
        return
    cert = srv.tls.get("ssl_certificate", result.doc.get("ssl_certificate"))
    key = srv.tls.get("ssl_certificate_key", result.doc.get("ssl_certificate_key"))
    if cert is None or key is None:
        problem = "listen ssl without " + " and ".join(
            k for k, v in (("ssl_certificate", cert), ("ssl_certificate_key", key)) if v is None
        )
    else:
        problem = _unreadable(cert) or _unreadable(key)
    if not problem:
        return
    plain = [entry for entry in srv.listen if not entry.endswith(" ssl")]
    dropped = [entry for entry in srv.listen if entry.endswith(" ssl")]
    srv.listen = plain
    for k in CERT_KEYS:
        srv.tls.pop(k, None)
    what = "its ssl listens left out" if plain else "server left out"
    hint = "; import where the certificates can be read" if problem.startswith("cannot read") else ""
    result.skipped_server(srv, f"{problem}: {what} ({', '.join(dropped)}){hint}")


def _why_nothing(directives: list[Directive], left_out: list[str]) -> str:
    names: set[str] = set()

    def walk(block: list[Directive]) -> None:
        for d in block:
            names.add(d.name)
            if d.block is not None:
                walk(d.block)

    walk(directives)
    if "server" not in names:
        return "nothing is proxied: no server block here (a fragment meant to be included? import the main nginx.conf)"
    if names & set(NON_HTTP_CONTENT) and "proxy_pass" not in names:
        return "nothing is proxied: this configuration serves files or FastCGI/uwsgi only"
    if "proxy_pass" not in names and "return" not in names:
        return "nothing is proxied: this configuration serves files only"
    if not left_out:
        return "nothing is left to serve: no server could be translated (see the lines skipped above)"
    more = f" (and {len(left_out) - 1} more servers left out)" if len(left_out) > 1 else ""
    return f"nothing is left to serve: {left_out[0]}{more}"
