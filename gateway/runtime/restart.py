"""What a reload cannot change: the settings that take effect only when the gateway restarts.

A reload swaps the plan, the upstreams, the zones, the logs, the edge settings, the TLS
certificates and the ``listen`` addresses in place. What is built once at start stays as it
was: the admin API (its address and token), the ``metrics.listen`` listener, the limit
store and the ban list's connection (``store``, ``bans.sync_interval``), the pid file, the
drain timeout of the listeners, and, in a gateway started as a single process, the number
of workers. ``restart_notes`` names each such change, for the reload's reply
(``notes``, printed by ``gateway reload``) and the error log; a key's new value is never
shown (``admin.token`` is a secret).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.config.schema import ConfigSpec

# (the key as an operator writes it, how to read it from a ConfigSpec)
RESTART_KEYS: tuple[tuple[str, Callable[[ConfigSpec], Any]], ...] = (
    ("admin.listen", lambda spec: spec.admin.listen),
    ("admin.token", lambda spec: spec.admin.token),
    ("admin.token_file", lambda spec: spec.admin.token_file),
    ("metrics.listen", lambda spec: spec.metrics.listen),
    ("store", lambda spec: spec.store),
    ("bans.sync_interval", lambda spec: spec.bans.sync_interval_ms),
    ("shutdown_timeout", lambda spec: spec.shutdown_timeout_ms),
    ("pid", lambda spec: spec.pid),
    ("state_dir", lambda spec: spec.state_dir),
)


def restart_note(key: str) -> str:
    return f"{key} changes take effect on restart, not on reload"


def restart_notes(old: ConfigSpec, new: ConfigSpec, *, single_process: bool) -> list[str]:
    """One note per setting that differs between ``old`` and ``new`` and needs a restart.

    ``single_process``: the gateway runs without a master, which a ``workers`` change needs."""
    notes = [restart_note(key) for key, read in RESTART_KEYS if read(old) != read(new)]
    if single_process and new.workers != old.workers:
        notes.append(
            f"workers: {_workers_text(old.workers)} -> {_workers_text(new.workers)} "
            "needs a restart: this gateway was started with one worker and runs as a single process, "
            "without a master to start workers (start it with workers >= 2 to change them on reload)"
        )
    return notes


def _workers_text(count: int) -> str:
    return "auto" if count == 0 else str(count)
