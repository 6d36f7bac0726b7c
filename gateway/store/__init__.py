"""Where limit state lives: the ``Store`` protocol and its engines.

* ``base``: what every store does for the request path (``Store``);
* ``memory``: the embedded store, in this process;
* ``shared``: the master's embedded store, reached by the workers of ``workers: N``;
* ``redis/``: limit state shared by every node of a cluster (and by OpenResty nodes);
* ``factory``: ``make_store``, the one place that picks one; ``inspect``: one key's state.
"""

from gateway.store.base import Store
from gateway.store.factory import SOCKET_ENV, make_store

__all__ = ["SOCKET_ENV", "Store", "make_store"]
