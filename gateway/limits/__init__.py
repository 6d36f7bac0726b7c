"""Limit decisions, pure: no I/O, the clock injected.

* nginx's kinds, each with its own path through the stores: ``nginx_req.py`` (limit_req,
  with delays and bans), ``count.py`` and ``sliding_count.py`` (limit_count, fixed or
  sliding window), ``conn.py`` (limit_conn, with leases); ``resty_req.py`` is
  resty.limit.req's float arithmetic, the reference of the Redis scripts.
* the zone types of ``limits:``, one module each: ``gcra.py``, ``sliding_log.py``,
  ``token.py``. Each ends with its ``ZONE_TYPE`` record (``algo.py``): parameters, decision,
  state encoding, Redis script and inspect views. ``registry.py`` finds them; the plan and
  the stores look a type up there and never branch on its name.
* ``params.py``: the parameter records every engine shares; ``outcome.py``: what a type answers.

A new zone type is three files: its module here (with ``ZONE_TYPE``), its script in
``scripts/lua/`` (defining ``<type>_algo_peek`` and ``<type>_algo_commit``), and its keys in
the config schema (``gateway/config/zones.py``).
"""
