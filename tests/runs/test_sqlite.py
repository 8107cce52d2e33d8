"""snapshot_sqlite: SQLite's online backup of a library, the checkpoint's and the working copy's one copy."""

from __future__ import annotations

import sqlite3

from slea.runs.sqlite import snapshot_sqlite


def test_snapshot_copies_the_committed_state_the_write_ahead_log_included(tmp_path):
    db = tmp_path / "library.sqlite"
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")  # the last rows stay in the -wal file
    writer.execute("CREATE TABLE entries (id INTEGER PRIMARY KEY, text TEXT)")
    writer.executemany("INSERT INTO entries (text) VALUES (?)", [(f"lesson {i}",) for i in range(50)])
    writer.execute("BEGIN")
    writer.execute("INSERT INTO entries (text) VALUES ('not committed')")  # an open transaction is not copied
    assert (tmp_path / "library.sqlite-wal").stat().st_size > 0

    snapshot_sqlite(db, tmp_path / "copy.sqlite")
    # the same pages as SQLite's own backup of the same source, made here directly
    direct = sqlite3.connect(tmp_path / "direct.sqlite")
    source = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    source.backup(direct)
    source.close()
    direct.close()
    writer.execute("ROLLBACK")
    writer.close()

    assert (tmp_path / "copy.sqlite").read_bytes() == (tmp_path / "direct.sqlite").read_bytes()
    rows = [r[0] for r in sqlite3.connect(tmp_path / "copy.sqlite").execute("SELECT text FROM entries")]
    assert rows == [f"lesson {i}" for i in range(50)]
