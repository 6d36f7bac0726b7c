"""Ban table, blocklist format and ban policy (gateway/bans)."""
