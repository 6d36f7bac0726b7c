"""Upstream selection and pools (gateway/proxy)."""
