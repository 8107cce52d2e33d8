"""Atomic file writes: the one helper every run file, cache and checkpoint goes through; and slea's cache root.

A file is written next to its destination under a temporary name, flushed, and renamed over it
(``os.replace``): a kill at any moment leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_model_dir", "atomic_open", "atomic_write_bytes", "atomic_write_text", "cache_dir"]


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", *, encoding: str | None = "utf-8") -> Iterator[IO[Any]]:
    """Open a temporary sibling of ``path`` for writing; on a clean exit it is flushed, fsynced and renamed
    onto ``path``; on an exception it is removed and ``path`` is untouched. ``mode``: ``"w"`` or ``"wb"``."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes whole files: mode 'w' or 'wb', got {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str, *, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically; returns ``path``."""
    with atomic_open(path, "w", encoding=encoding) as fh:
        fh.write(text)
    return Path(path)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; returns ``path``."""
    with atomic_open(path, "wb") as fh:
        fh.write(data)
    return Path(path)


def cache_dir() -> Path:
    """slea's cache root: ``$SLEA_CACHE_DIR``, else ``$XDG_CACHE_HOME/slea``, else ``~/.cache/slea``."""
    if os.environ.get("SLEA_CACHE_DIR"):
        return Path(os.environ["SLEA_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "slea"


def atomic_model_dir(final: Path, build: Callable[[Path], object]) -> Path:
    """A model folder built in a temporary sibling and renamed into place, so a killed build leaves nothing. A build
    that wrote no ``config.json`` is never put in place (transformers' ``save_pretrained`` writes nothing in a
    process of rank > 0 of an initialised ``torch.distributed`` group)."""
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".", dir=final.parent))
    try:
        build(tmp)
        if not (tmp / "config.json").is_file():
            raise RuntimeError(f"building {final.name} wrote no config.json (a data-parallel rank > 0 saves "
                               f"nothing: build it in one process first)")
        try:
            tmp.rename(final)
        except OSError:  # another process won the race
            if not (final / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
