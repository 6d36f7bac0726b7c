"""Configuration: YAML text -> validated, frozen ``*Spec`` objects, with file:line:key errors.

``source``/``compose``/``reader``: YAML with locations and bounds; ``units``: nginx's value
syntaxes. ``schema``: the top-level keys and ``ConfigSpec``, built by one module per section,
each holding that section's specs and parser: ``listen``, ``edge``, ``realip``, ``log``,
``admin``, ``metrics``, ``upstreams``, ``zones`` (with the per-type key tables), ``limits`` (a
route's uses of zones), ``routes`` (and ``defaults``), ``servers``, ``tls``, ``access``, ``bans``,
``store``. Import a spec from the module that defines it. Compiling specs into per-route plans
is ``gateway.plan``'s job, not this package's.
"""

from gateway.config.schema import ConfigSpec, parse_config

__all__ = ["ConfigSpec", "parse_config"]
