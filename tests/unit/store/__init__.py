"""The embedded store and the master's shared store (gateway/store)."""
