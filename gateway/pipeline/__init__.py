"""The per-request flow: real IP -> server -> route -> access.deny, bans -> rules -> limits -> allow/deny -> proxy.

``flow``: the pipeline itself, in order, on one screen; ``limiting``: its limits step (the
route's zones asked of the store, and nginx's status variables, headers and log lines).
"""

from gateway.pipeline.flow import Pipeline

__all__ = ["Pipeline"]
