"""The ``gateway`` command.

``commands``: the argument parser and ``run``/``check``; ``control``: reload, ban, unban, bans and
zone commands against running gateways; ``signals``: ``stop`` and reload through the pid file;
``demo``: the demo upstream.
"""

from gateway.cli.commands import main

__all__ = ["main"]
