"""The embedded store's bans on disk: one SQLite database (``bans.sqlite3``) in ``state_dir``.

``LocalBans`` (``local.py``) writes every change here, in one transaction per call, before
it changes the ban table or answers the admin API; at start it reads back every ban still
in force and deletes the ended ones. The journal is SQLite's write-ahead log (WAL) with
``synchronous=FULL``: a committed ban survives a ``kill -9`` and a power cut.

Calls are blocking (a bulk of 100,000 bans takes a few hundred ms): ``LocalBans`` runs them
in a thread, one at a time. Every failure to open, read or write the file is a
``BanStoreError`` that names it.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import threading
from collections.abc import Sequence

from gateway.bans.table import Ban
from gateway.errors import BanStoreError
from gateway.files import make_private_dir

FILE_NAME = "bans.sqlite3"
SCHEMA = """
CREATE TABLE IF NOT EXISTS bans (
    target TEXT PRIMARY KEY,
    until_ms INTEGER NOT NULL,
    reason TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    by TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS bans_until ON bans (until_ms) WHERE until_ms > 0;
"""


def database_path(state_dir: str) -> str:
    return os.path.join(state_dir, FILE_NAME)


def writable_problem(state_dir: str) -> str | None:
    """Why this process could not keep bans in ``state_dir`` (None: it can, as far as one can tell
    without writing): the directory, or the nearest existing parent that would hold it, must be
    writable, and an existing database file must be writable too."""
    path = os.path.abspath(state_dir)
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable by this user (uid {os.getuid()})"
    db = database_path(path)
    if os.path.exists(db) and not os.access(db, os.R_OK | os.W_OK):
        return f"{db} is not readable and writable by this user (uid {os.getuid()})"
    return None


class BanDatabase:
    """The bans table of one SQLite file; every method commits before it returns."""

    def __init__(self, state_dir: str) -> None:
        self.path = database_path(state_dir)
        self.state_dir = state_dir
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()  # one call at a time, whatever thread it runs in

    def _fail(self, doing: str, exc: BaseException) -> BanStoreError:
        return BanStoreError(
            f"cannot {doing} the ban database {self.path}: {exc}; "
            f"bans are kept in state_dir ({self.state_dir}): fix its permissions, free space, "
            "or move a damaged file aside (the bans it held are then lost)"
        )

    def open(self) -> None:
        """Create the directory and the file if needed, check the file, switch to WAL."""
        try:
            make_private_dir(self.state_dir)
            st = os.stat(self.state_dir)
        except OSError as exc:
            raise self._fail("create the directory of", exc) from None
        if st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_uid != os.getuid()):
            # As for the pid file: a neighbour could put a list of bans of its own there.
            raise BanStoreError(
                f"refusing to keep the bans in {self.state_dir}: others can write that directory "
                f"(mode {stat.S_IMODE(st.st_mode):04o}); give state_dir a directory of this user's own"
            )
        try:
            conn = sqlite3.connect(self.path, timeout=5.0, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise self._fail("open", exc) from None
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            row = conn.execute("PRAGMA quick_check").fetchone()
            if row is None or row[0] != "ok":
                raise sqlite3.DatabaseError(f"integrity check failed: {row[0] if row else 'no answer'}")
            conn.executescript(SCHEMA)
        except sqlite3.Error as exc:
            conn.close()
            raise self._fail("use", exc) from None
        self._conn = conn

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise BanStoreError(f"the ban database {self.path} is not open")
        return self._conn

    def load(self, now_ms: int) -> list[Ban]:
        """Delete the bans that have ended; return the others."""
        with self._lock:
            db = self._db()
            try:
                db.execute("BEGIN IMMEDIATE")
                db.execute("DELETE FROM bans WHERE until_ms > 0 AND until_ms <= ?", (now_ms,))
                rows = db.execute("SELECT target, until_ms, reason, created_ms, by FROM bans").fetchall()
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback(db)
                raise self._fail("read", exc) from None
        return [Ban(*row) for row in rows]

    def put_many(self, bans: Sequence[Ban]) -> None:
        """Add or replace ``bans``, in one transaction."""
        self._write(
            "INSERT OR REPLACE INTO bans (target, until_ms, reason, created_ms, by) VALUES (?, ?, ?, ?, ?)",
            bans,  # a Ban is the tuple of its columns, in order
        )

    def remove_many(self, targets: Sequence[str]) -> None:
        """Remove ``targets`` (those not there are ignored), in one transaction."""
        self._write("DELETE FROM bans WHERE target = ?", [(t,) for t in targets])

    def purge(self, now_ms: int) -> int:
        """Delete the bans that ended by ``now_ms``; how many."""
        with self._lock:
            db = self._db()
            try:
                return db.execute("DELETE FROM bans WHERE until_ms > 0 AND until_ms <= ?", (now_ms,)).rowcount
            except sqlite3.Error as exc:
                raise self._fail("write", exc) from None

    def _write(self, sql: str, rows: Sequence[tuple[object, ...]]) -> None:
        if not rows:
            return
        with self._lock:
            db = self._db()
            try:
                db.execute("BEGIN IMMEDIATE")
                db.executemany(sql, rows)
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback(db)
                raise self._fail("write", exc) from None

    @staticmethod
    def _rollback(db: sqlite3.Connection) -> None:
        if db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
