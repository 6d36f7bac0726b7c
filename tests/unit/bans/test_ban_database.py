"""The embedded store's ban database: what is committed is what a new process loads.

Real SQLite files in a temporary state directory; ``LocalBans`` as the node uses it.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from gateway.bans.database import BanDatabase, writable_problem
from gateway.bans.local import LocalBans
from gateway.bans.table import Ban, BanList
from gateway.clock import epoch_ms
from gateway.errors import BanStoreError


async def started(state: Path) -> LocalBans:
    bans = LocalBans(BanList(), BanDatabase(str(state)))
    await bans.start()
    return bans


async def test_changes_are_loaded_by_the_next_process_and_ended_bans_are_deleted(tmp_path: Path) -> None:
    now = epoch_ms()
    first = await started(tmp_path / "state")
    await first.add_many(
        [
            Ban("198.51.100.1/32", 0, "for ever", now, "cli"),
            Ban("2001:db8::/48", now + 3_600_000, "an hour", now, "api"),
            Ban("192.0.2.1/32", now - 1, "ended", now - 10, "api"),
            Ban("192.0.2.2/32", 0, "lifted", now, "api"),
        ]
    )
    assert await first.remove_many(["192.0.2.2/32", "192.0.2.99/32"]) == ["192.0.2.2/32"]
    # no close(): as after a kill -9, only what was committed counts
    second = await started(tmp_path / "state")
    assert second.loaded == 2
    assert second.banlist.bans == {
        "198.51.100.1/32": Ban("198.51.100.1/32", 0, "for ever", now, "cli"),
        "2001:db8::/48": Ban("2001:db8::/48", now + 3_600_000, "an hour", now, "api"),
    }
    with sqlite3.connect(tmp_path / "state" / "bans.sqlite3") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("SELECT count(*) FROM bans").fetchone()[0] == 2  # the ended one left the file
    await first.close()
    await second.close()


async def test_a_file_that_is_not_a_database_is_an_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "bans.sqlite3").write_bytes(b"not sqlite" * 500)
    with pytest.raises(BanStoreError, match=str(tmp_path / "bans.sqlite3")):
        await started(tmp_path)


async def test_a_failed_write_changes_nothing_in_force(tmp_path: Path) -> None:
    bans = await started(tmp_path)
    assert bans.database is not None
    bans.database.close()  # the next write fails
    with pytest.raises(BanStoreError):
        await bans.add_many([Ban("198.51.100.7/32", 0, "", epoch_ms(), "cli")])
    assert len(bans.banlist) == 0


@pytest.mark.skipif(os.getuid() == 0, reason="root writes anywhere")
def test_writable_problem_names_a_directory_this_user_cannot_write(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert "not writable" in (writable_problem(str(locked / "state")) or "")


def test_writable_problem_names_a_file_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    assert writable_problem(str(tmp_path / "file" / "state")) == f"{tmp_path / 'file'} is not a directory"
    assert writable_problem(str(tmp_path / "new" / "state")) is None


async def test_a_state_dir_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(BanStoreError, match="others can write"):
        await started(shared)
    assert list(shared.iterdir()) == []
