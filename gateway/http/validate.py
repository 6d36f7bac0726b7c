"""What a request must look like before it is routed: nginx's checks on the target, Host and framing.

* A ``#`` anywhere in the request target: 400. A fragment is no part of a request target
  (RFC 9112 §3.2); nginx and the usual backends cut the path at ``#``, so a gateway that
  routed on the rest could send ``/admin/secret#/../../public`` past ``location /admin/``.
* The host, from ``Host`` or an absolute-form target's authority, as
  ``ngx_http_validate_host`` checks it: no ``/``, ``\\``, control byte, space or DEL, no
  ``..``, not empty. An authority with userinfo (``http://u:p@host/``) is refused as
  nginx's request-line parser refuses it.
* ``Transfer-Encoding`` other than ``chunked`` alone: 501, as nginx answers; a coding
  such as ``gzip, chunked`` would otherwise be dropped without a word.

Each check is one C-level scan of a short string, and a host seen before is looked up
in a bounded cache.
"""

from __future__ import annotations

from functools import lru_cache

from multidict import CIMultiDictProxy

_HOST_FORBIDDEN = frozenset(chr(c) for c in range(0x21)) | {"\x7f", "/", "\\"}


@lru_cache(maxsize=1024)
def host_problem(host: str) -> str:
    """Why nginx would refuse this host ("" when it would not); ``host`` as sent, with any port."""
    if not host:
        return "empty host"
    if "@" in host:
        return "userinfo in the authority"
    if not _HOST_FORBIDDEN.isdisjoint(host):
        return "invalid character in host"
    name = host
    if name.startswith("["):
        end = name.find("]")
        name = name[: end + 1] if end >= 0 else name
    else:
        colon = name.find(":")
        name = name[:colon] if colon >= 0 else name
    if ".." in name:
        return "invalid host"
    if name.rstrip(".") == "":
        return "invalid host"
    return ""


def request_problem(target: str, authority: str, headers: CIMultiDictProxy[str], http11: bool) -> tuple[int, str]:
    """The status and reason nginx would refuse this request with, or ``(0, "")``.

    ``authority``: the absolute-form target's authority, or the ``Host`` header (which an
    HTTP/1.0 request may leave out)."""
    if "#" in target:
        return 400, "fragment in request target"
    if authority or http11 or "Host" in headers:
        problem = host_problem(authority)
        if problem:
            return 400, f"client sent invalid host header ({problem})"
    codings = headers.getall("Transfer-Encoding", ())
    if codings and (len(codings) > 1 or codings[0].strip().lower() != "chunked"):
        return 501, "client sent unknown Transfer-Encoding"
    return 0, ""
