"""``gateway replay`` (filled in by the replay modules)."""

from __future__ import annotations

import argparse


def run_replay(args: argparse.Namespace) -> int:
    raise NotImplementedError
