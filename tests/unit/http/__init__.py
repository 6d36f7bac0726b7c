"""Per-request nginx semantics (gateway/http): keys, real IP, location matching."""
