"""The Redis scripts, shipped as the package data of ``gateway.lua``.

This directory is where the scripts live: OpenResty nodes load ``limit_req.lua``
from here, and packaging installs it as the ``gateway.lua`` package (see
pyproject.toml), so an installed gateway reads the very same files.
"""
