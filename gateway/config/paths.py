"""Default paths the configuration resolves: the pid file's.

They sit with the configuration because ``pid:`` is resolved when a file is read, and the
commands that find a running gateway (``stop``, ``reload``) resolve it the same way.
"""

from __future__ import annotations

import hashlib
import os
import tempfile


def default_path(config_file: str) -> str:
    absolute = os.path.abspath(config_file)
    stem = os.path.splitext(os.path.basename(absolute))[0] or "gateway"
    digest = hashlib.sha256(absolute.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    name = f"{stem}-{digest}.pid"
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "gateway", name)
    return os.path.join(tempfile.gettempdir(), f"gateway-{os.getuid()}", name)


def resolve(configured: str | None, config_file: str) -> str:
    """The pid file's absolute path for a ``pid:`` value (None: the default)."""
    if configured is None:
        return default_path(config_file)
    return os.path.join(os.path.dirname(os.path.abspath(config_file)), os.path.expanduser(configured))
