"""Manual and automatic bans: an IP or CIDR, until a time, with a reason, on every route.

``table``: the local ban table every serving process checks (one dict probe per prefix length);
``local``: bans kept by this node; ``redis``: bans shared through Redis and followed by every
node; ``open``: which of the two a process uses; ``policy``: which bans need ``--force``;
``blocklist``: the one-address-a-line file format.
"""
