"""Access log formats and escaping (gateway/logs)."""
