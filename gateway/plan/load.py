"""Read, validate and compile a configuration: the one entry from a file to a ``CompiledConfig``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.config.schema import parse_config
from gateway.config.source import parse_yaml, read_document
from gateway.plan.compiled import CompiledConfig, compile_config

if TYPE_CHECKING:
    from gateway.config.overrides import Overrides


def load_config(path: str, overrides: Overrides | None = None, *, gradual_free: bool = False) -> CompiledConfig:
    """Read, validate and compile a configuration file; raises ``ConfigErrors``.

    ``gradual_free``: empty the parsed document piece by piece once used (a reload in a
    worker thread: see ``gateway.config.offloop``), rather than dropping a big tree at once."""
    document = read_document(path)
    try:
        spec = parse_config(document)
    finally:
        if gradual_free:
            document.discard()
    if overrides is not None:
        spec = overrides.apply(spec)
    return compile_config(spec)


def load_config_text(text: str, file: str = "<text>") -> CompiledConfig:
    return compile_config(parse_config(parse_yaml(text, file)))
