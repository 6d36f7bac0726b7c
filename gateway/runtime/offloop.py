"""Load a configuration for a reload without stalling the event loop that serves traffic.

Parsing and compiling a large file is pure Python work (a quarter of a second
for 2000 locations), so it runs in a worker thread and the caller swaps the
result in on the loop. The threads share the GIL, so while a load runs:

* the switch interval drops to ``RELOAD_SWITCH_INTERVAL_S``: by default a
  thread that wants the GIL waits up to 5 ms for it, and the loop asks for it
  again after every system call;
* the cyclic garbage collector is paused: a full collection of a heap swollen
  by a parse holds the GIL for 100 ms and more. Nothing a load allocates needs
  it (the trees it drops have no cycles); afterwards what the load kept is moved
  to the oldest generation in O(1) (``gc.freeze`` then ``gc.unfreeze``) rather
  than scanned by the next young collection on the loop;
* large trees are freed a little at a time (``teardown.py``): the parsed
  document here, the replaced configuration in ``release_off_loop``.

Loads are serialized per event loop, so two quick SIGHUPs apply in the order
they came and an older file never replaces a newer one.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from gateway.config.teardown import release
from gateway.plan import load_config

if TYPE_CHECKING:
    from gateway.config.overrides import Overrides
    from gateway.plan.compiled import CompiledConfig

RELOAD_SWITCH_INTERVAL_S = 0.0005

_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


async def load_config_off_loop(path: str, overrides: Overrides | None = None) -> CompiledConfig:
    """``gateway.plan.load_config`` in a worker thread; raises ``ConfigErrors`` like it."""
    loop = asyncio.get_running_loop()
    lock = _locks.get(loop)
    if lock is None:
        lock = _locks[loop] = asyncio.Lock()
    async with lock:
        collecting = gc.isenabled()
        gc.disable()
        try:
            with _short_switch_interval():
                return await asyncio.to_thread(_load, path, overrides)
        finally:
            if collecting:
                if gc.get_freeze_count() == 0:  # never thaw what someone else froze
                    gc.freeze()  # promote, unscanned, what the load kept
                    gc.unfreeze()
                gc.enable()


async def release_off_loop(holder: list[object]) -> None:
    """Free what ``holder`` holds (a replaced configuration) in a worker thread, gradually."""
    with _short_switch_interval():
        await asyncio.to_thread(release, holder)


_boosts = 0
_saved_interval = 0.0


@contextmanager
def _short_switch_interval() -> Iterator[None]:
    """Lower the switch interval while any load or release runs; restore it after the last."""
    global _boosts, _saved_interval
    if _boosts == 0:
        _saved_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(_saved_interval, RELOAD_SWITCH_INTERVAL_S))
    _boosts += 1
    try:
        yield
    finally:
        _boosts -= 1
        if _boosts == 0:
            sys.setswitchinterval(_saved_interval)


def _load(path: str, overrides: Overrides | None) -> CompiledConfig:
    return load_config(path, overrides, gradual_free=True)
