"""One behavioural suite for every store: the same vectors, the same fake clock (Redis ones marked redis)."""
