"""Configuration: YAML text -> validated, frozen ``*Spec`` objects, with file:line:key errors.

``source``/``compose``/``reader``: YAML with locations and bounds; ``schema``: the specs and
the parsers of each section; ``units``: nginx's value syntaxes. Compiling specs into per-route
plans is ``gateway.plan``'s job, not this package's.
"""

from gateway.config.schema import ConfigSpec, parse_config

__all__ = ["ConfigSpec", "parse_config"]
