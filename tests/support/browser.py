"""The browser driver for the status page tests: headless Chromium over the DevTools protocol.

The driver itself is scripts/cdp.py, because scripts/screenshot_status.py drives the same
browser and scripts/ imports nothing from tests/; this module is its face for the tests.
"""

from __future__ import annotations

import sys

from tests.support.paths import SCRIPTS

if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

from cdp import Browser, CdpError, find_chromium

__all__ = ["Browser", "CdpError", "find_chromium"]
