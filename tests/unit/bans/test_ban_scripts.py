"""The ban list's Lua scripts are package data beside the store's (``scripts/lua/ban_*.lua``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.bans import redis as ban_redis

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", ban_redis.SCRIPTS)
def test_each_ban_script_is_read_from_the_gateway_lua_package(name: str) -> None:
    assert name.startswith("ban_") and name.endswith(".lua")
    assert ban_redis.script_source(name) == (ROOT / "scripts" / "lua" / name).read_text(encoding="utf-8")
    assert "redis.call(" in ban_redis.script_source(name)


def test_require_scripts_reads_them_all() -> None:
    ban_redis.require_scripts()
