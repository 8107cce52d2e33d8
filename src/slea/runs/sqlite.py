"""A consistent copy of an SQLite database: what a checkpoint keeps of the experience library, and how a run
gets its private working copy of a library file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

__all__ = ["snapshot_sqlite"]


def snapshot_sqlite(src: str | Path, dst: str | Path) -> None:
    """Copy the database ``src`` (opened read-only) into ``dst`` with SQLite's online backup API: the committed
    state, what is still in the write-ahead log included, even while another connection writes."""
    source = sqlite3.connect(f"file:{Path(src).resolve()}?mode=ro", uri=True)
    target = sqlite3.connect(str(dst))
    try:
        source.backup(target)
    finally:
        target.close()
        source.close()
