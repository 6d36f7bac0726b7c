"""``gateway import-nginx``: read an nginx configuration and write a gateway one.

``parser`` reads nginx's grammar (includes spliced in); ``translate`` walks the main and
http levels and hands each directive to its family: ``servers`` (``listen``,
``server_name``), ``locations`` (routes, inheritance through ``scope``), ``upstreams``
(``upstream``, ``proxy_pass``), ``limits`` (zones and their uses), ``access`` (allow/deny,
real IP), ``headers`` (``return``, ``proxy_set_header``, ``add_header``), ``logs``,
``tls`` and ``edge``; ``context`` is the state they share. ``emit`` writes the ``Result``
as YAML with what was skipped; ``command`` is the CLI's entry.
"""
