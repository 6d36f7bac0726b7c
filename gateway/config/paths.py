"""Default paths the configuration resolves: the pid file's, and the state directory's.

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


def resolve_state_dir(configured: str | None, pid_path: str | None, config_file: str) -> str:
    """The state directory's absolute path for a ``state_dir:`` value.

    None: beside the pid file (the default one when ``pid: off``), named after it:
    ``.../gateway-1a2b3c4d.pid`` -> ``.../gateway-1a2b3c4d.state``. The default pid
    directory may be a tmpfs (``$XDG_RUNTIME_DIR``, ``/tmp``): a server sets ``state_dir``.
    """
    if configured is not None:
        return os.path.normpath(
            os.path.join(os.path.dirname(os.path.abspath(config_file)), os.path.expanduser(configured))
        )
    pid = pid_path or default_path(config_file)
    stem = os.path.splitext(os.path.basename(pid))[0] or "gateway"
    return os.path.join(os.path.dirname(pid), f"{stem}.state")
