"""Default paths the configuration resolves: the runtime directory, the pid file in it, and the state directory.

They sit with the configuration because ``pid:`` is resolved when a file is read, and the
commands that find a running gateway (``stop``, ``reload``, ``token``) resolve them the same way.

The runtime directory holds the default pid file and the generated admin token:
``$XDG_RUNTIME_DIR/gateway``, else ``<tmp>/gateway-<uid>``. In a shared /tmp anyone can create
``gateway-<uid>`` first; a directory there that is not ours (another owner, a symbolic link,
not a directory, writable by others) is never used. The gateway then falls back to a private
one, ``$XDG_STATE_HOME/gateway/run`` (default ``~/.local/state/gateway/run``), and says so
(``runtime_dir().fallback_reason``); the CLI, which resolves the same way, finds it there.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class RuntimeDir:
    """The runtime directory to use, and why it is the fallback (None: it is the usual one)."""

    path: str
    fallback_reason: str | None = None


def primary_runtime_dir() -> str:
    """``$XDG_RUNTIME_DIR/gateway`` when that variable names a directory, else ``<tmp>/gateway-<uid>``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "gateway")
    return os.path.join(tempfile.gettempdir(), f"gateway-{os.getuid()}")


def fallback_runtime_dir() -> str:
    """``$XDG_STATE_HOME/gateway/run``, default ``~/.local/state/gateway/run``: under the user's home,
    where no other user can create it first."""
    state = os.environ.get("XDG_STATE_HOME", "")
    if not state or not os.path.isabs(state):
        state = os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "gateway", "run")


def unsafe_reason(path: str) -> str | None:
    """Why ``path`` must not be used as a private directory; None when it is ours (or absent)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path} cannot be examined ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != os.getuid():
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & 0o022:
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def runtime_dir() -> RuntimeDir:
    """The runtime directory: the usual one unless it exists and is not safely ours (see above)."""
    primary = primary_runtime_dir()
    reason = unsafe_reason(primary)
    if reason is None:
        return RuntimeDir(primary)
    return RuntimeDir(fallback_runtime_dir(), reason)


def default_path(config_file: str) -> str:
    absolute = os.path.abspath(config_file)
    stem = os.path.splitext(os.path.basename(absolute))[0] or "gateway"
    digest = hashlib.sha256(absolute.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return os.path.join(runtime_dir().path, f"{stem}-{digest}.pid")


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
