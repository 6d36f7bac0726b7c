"""The client-facing side: connection caps, timeouts, request-line checks and TLS termination.

``protocol``: aiohttp's HTTP/1 server protocol, hardened; ``requestline``: checks before the
parser; ``connections``: caps at accept and reuse near the cap; ``tls``: certificates by SNI;
``settings``: the edge's settings from the config.
"""

from gateway.edge.protocol import EdgeProtocol, EdgeServer, EdgeSettings, unsupported_version
from gateway.edge.settings import edge_settings, raise_fd_limit, set_server_tokens

__all__ = [
    "EdgeProtocol",
    "EdgeServer",
    "EdgeSettings",
    "edge_settings",
    "raise_fd_limit",
    "set_server_tokens",
    "unsupported_version",
]
