"""The per-request flow: real IP -> virtual server -> route -> access -> bans -> limits -> proxy -> log.

``flow``: the pipeline itself, in order, on one screen; ``limiting``: its limits step (the
route's zones asked of the store, and nginx's status variables, headers and log lines).
"""

from gateway.pipeline.flow import Pipeline

__all__ = ["Pipeline"]
