"""The per-request nginx semantics, with no I/O: what a request means before it is proxied.

``context``: what one request carries; ``realip``: the client's real address; ``vhosts``: the
virtual server; ``routing``: ``location`` matching; ``keys``: limit keys from nginx variables;
``templates``: header values and texts with variables; ``addheader``: ``add_header``;
``responses``: the gateway's own short responses; ``returns``: ``return`` routes.
"""
