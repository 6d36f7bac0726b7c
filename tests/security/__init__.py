"""The gateway as an attacker sees it: hostile requests, floods, connection exhaustion, config bombs, the admin API."""
