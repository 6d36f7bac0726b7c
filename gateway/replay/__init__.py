"""``gateway replay``: an access log run through the configured routes and zones."""
