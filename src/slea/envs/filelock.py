"""An exclusive advisory file lock across processes, for the env families' on-disk game caches."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block; each call opens its own file
    description, so threads of one process exclude each other too. Not POSIX: no lock, and the callers' atomic
    renames alone keep readers from half-written files."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        try:
            import fcntl
        except ImportError:
            yield
            return
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
