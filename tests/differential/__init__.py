"""Differential tests: the same timed requests through the real nginx and through the gateway."""
