"""The connection edge (gateway/edge): per-address connection caps."""
