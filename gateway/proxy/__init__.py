"""The upstream side: pools, balancing, forwarding and WebSocket.

``upstream``: a pool per upstream (keep-alive connections, its balancer); ``balancer`` and
``hashing``: which server (round-robin, ``ip_hash``, ``hash``); ``http1``: the HTTP/1.1 client;
``nextupstream``: the tries over servers that HTTP and WebSocket share; ``forward`` and
``respond``: one proxied request and its response; ``spool`` and ``clientbody``: buffered
bodies; ``websocket`` and ``tunnel``: upgrades; ``headers`` and ``rewrite``: what is sent.
"""
