"""Unit tests, mirroring gateway/: one folder per package, no gateway process (its CLI at most)."""
