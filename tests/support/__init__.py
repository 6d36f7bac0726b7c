"""What the tests share: real parts to run the gateway against, and nothing mocked.

* ``paths``: the checkout's root; ``ports``: ``free_port`` and ``wait_port``;
* ``gateway``: the gateway through its CLI (``Gateway``, ``cli``); ``config``: its YAML;
* ``http``: one-line HTTP requests; ``upstreams``: upstream doubles on real sockets;
* ``redis_procs``: redis-server processes (standalone, cluster, sentinel);
* ``nginx``, ``openresty``, ``differential``: nginx as the reference implementation;
* ``certs``: a CA and certificates made at run time; ``browser``: headless Chromium;
* ``ban_lists``: generated blocklists; ``conformance``: the store conformance vectors' scaffolding.

Test modules import from here (and get fixtures from conftest.py), never from each other.
"""
