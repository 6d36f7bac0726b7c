"""Specs compiled into what the request path reads: one immutable plan per route.

``compiled``: the plan objects and ``compile_config``; ``load``: file -> specs -> plan.
"""

from gateway.plan.compiled import CompiledConfig, RoutePlan, compile_config
from gateway.plan.load import load_config, load_config_text

__all__ = ["CompiledConfig", "RoutePlan", "compile_config", "load_config", "load_config_text"]
