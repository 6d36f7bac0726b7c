"""The status page: its files (``page.html``, ``page.js``, ``page.css``, ``favicon.svg``), shipped
as package data, and ``files.py``, which serves them for the admin API with a strict CSP.
"""

from gateway.admin.statuspage.files import CSP, response

__all__ = ["CSP", "response"]
