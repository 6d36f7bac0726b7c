"""The Prometheus text format's content type (the configuration's own figures are
``gateway.metrics.activity.ConfigInfo``, which the status page shows too)."""

from __future__ import annotations

# The names are all classic ones: the 0.0.4 text format, which every Prometheus version reads.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
