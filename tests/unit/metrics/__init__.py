"""Metrics and the master <-> worker stats channel (gateway/metrics)."""
