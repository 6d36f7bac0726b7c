"""Prometheus metrics: plain per-process counters (``stats``), the master <-> worker channel
(``channel``), the text format (``render``) and the endpoints (``endpoint``)."""

from gateway.metrics.config import CONTENT_TYPE
from gateway.metrics.hub import MetricsHub

__all__ = ["CONTENT_TYPE", "MetricsHub"]
