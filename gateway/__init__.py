"""A rate-limiting reverse proxy gateway.

Vocabulary, from the bottom up:

* ``config``: YAML text -> validated, frozen *Spec* objects (with file/line/key errors).
* ``plan``: Specs compiled once into immutable per-route plans the request path reads.
* ``limits``: the pure decision logic (nginx limit_req / limit_conn, resty.limit.count),
  with an injected clock and no I/O.
* ``store``: where limit state lives: the embedded in-process store or Redis.
* ``proxy``: the upstream side: pools, balancing, passive health, forwarding, WebSocket.
* ``pipeline``: the per-request flow: real IP -> route -> access.deny -> limits -> allow/deny -> proxy -> log.
* ``server`` / ``supervisor`` / ``cli``: process lifecycle, workers, signals, commands.
"""

__version__ = "0.1.0"
