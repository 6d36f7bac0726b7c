"""The Redis store, its Lua scripts, ban sync, cluster and Sentinel, against real redis-server processes (marked redis)."""
