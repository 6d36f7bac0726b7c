"""The admin API (``admin.listen``) for operators and the CLI, and the status page.

``api``: the app and its routes; ``auth``: who may call (browser checks, then the bearer token);
``guard``: the browser checks that keep web pages away; ``token``: the generated token;
``bans``: the ``/bans`` handlers and a ban's request and reply shapes; ``replies``: the JSON
replies; ``config_view``: the configuration in force as JSON; ``statuspage/``: the page's files;
``metrics_listener``: ``metrics.listen``, the token-less ``/metrics`` for scrapers, behind the
same browser checks.
"""
