"""Prometheus metrics: plain per-process counters (``stats``), the master <-> worker channel
(``channel``), the text format (``render``) and what a scrape collects (``hub``); the listeners that
serve them are the admin API's (``gateway/admin``: ``/metrics`` and ``metrics_listener``)."""

from gateway.metrics.config import CONTENT_TYPE
from gateway.metrics.hub import MetricsHub

__all__ = ["CONTENT_TYPE", "MetricsHub"]
