"""lua-resty-redis-ratelimit style OpenResty node and the gateway on one Redis (marked nginx and redis)."""
