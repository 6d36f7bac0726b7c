"""Configuration loading and validation (gateway/config, gateway/plan)."""
