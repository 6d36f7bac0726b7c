"""Access log replay (gateway/replay)."""
