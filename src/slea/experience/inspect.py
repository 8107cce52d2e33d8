"""Read-mostly helpers over a run's ``library.sqlite`` (the CLI's ``slea library show|search|export``)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from slea.experience.clustering import ObservationIndex
from slea.experience.library import ZONES, ExperienceLibrary
from slea.experience.manager import RetrievalResult
from slea.experience.retrieval import Retriever


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def check_library(path: str | Path) -> None:
    """A ``ValueError`` (one line naming the table, row and field) unless ``path`` is an experience library whose
    every row is well formed (:func:`slea.experience.portable.read_library`): an SQLite file with its ``entries``
    table, zones and levels the library knows, finite scores, texts, JSON where JSON belongs."""
    from slea.experience.portable import read_library

    read_library(path)  # PortableError is a ValueError


def _settings(path: Path) -> dict[str, Any]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        meta = dict(conn.execute("SELECT key, value FROM obs_meta")) if "obs_meta" in _tables(conn) else {}
    finally:
        conn.close()
    return {k: json.loads(v) for k, v in meta.items()}


def cluster_summary(path: str | Path) -> dict[str, Any]:
    """What a library's clusters were built on (``observation`` or ``state_key``; older libraries: observation),
    how many there are, their mean number of members (distinct observations; a library older than that count
    gives the distinct texts each cluster was assigned) and the share holding one member."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        have = _tables(conn)
        meta = dict(conn.execute("SELECT key, value FROM library_meta")) if "library_meta" in have else {}
        sizes = dict(conn.execute("SELECT cid, size FROM obs_clusters")) if "obs_clusters" in have else {}
        if "cluster_members" in have:
            counted = dict(conn.execute("SELECT cluster_id, COUNT(*) FROM cluster_members GROUP BY cluster_id"))
            sizes = {cid: counted.get(cid, n) for cid, n in sizes.items()}
    finally:
        conn.close()
    n = len(sizes)
    return {"built_on": meta.get("cluster_on", "observation"), "clusters": n,
            "members": sum(sizes.values()) / n if n else 0.0,
            "singletons": sum(1 for v in sizes.values() if v == 1) / n if n else 0.0}


def list_entries(path: str | Path, zone: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Entries (best score first) as dicts: id, zone, level, score, usage, success, clusters, text, ..."""
    if zone is not None and zone not in ZONES:
        raise ValueError(f"zone must be one of {ZONES}, got {zone!r}")
    lib = ExperienceLibrary(path)
    try:
        rows = sorted(lib.entries(zone), key=lambda e: (-e.score, -e.last_used_iter, e.id))
        return [e.to_dict() for e in rows[: max(0, int(limit))]]
    finally:
        lib.conn.close()  # a look only: no checkpoint while a run may be writing


def search(path: str | Path, text: str, task_type: str = "", *, top_k_pos: int = 2, top_k_neg: int = 1,
           max_tokens: int = 200, fallback_threshold: float = 0.5) -> RetrievalResult:
    """What an observation would retrieve (Eq.1, else Eq.2), ignoring the warm-up gate; changes nothing.

    ``cluster_id`` is the cluster it would join, or -1 if it would open a new one.
    """
    path = Path(path)
    meta = _settings(path)
    lib = ExperienceLibrary(path)
    try:
        index = ObservationIndex.load_sqlite(lib.conn, threshold=float(meta.get("threshold", 0.85)))
        cid = index.lookup(text, task_type)
        r = Retriever(lib, top_k_pos=top_k_pos, top_k_neg=top_k_neg, max_tokens=max_tokens,
                      fallback_threshold=fallback_threshold)
        got = r.retrieve(text, cid, task_type=task_type, link=False)
        return RetrievalResult(cid, got.entry_ids, got.text)
    finally:
        lib.conn.close()  # no checkpoint/flush: a read-only look


def export_jsonl(path: str | Path, out: str | Path) -> int:
    lib = ExperienceLibrary(path)
    try:
        return lib.export_jsonl(out)
    finally:
        lib.conn.close()


def import_jsonl(path: str | Path, src: str | Path) -> dict[str, int]:
    lib = ExperienceLibrary(path)
    try:
        return lib.import_jsonl(src)
    finally:
        lib.close()
