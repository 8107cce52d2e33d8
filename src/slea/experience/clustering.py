"""Observation clustering for SLEA-RL (paper §3.3): ``c(o) = c_i if sim(o, rep(c_i)) >= δ else new cluster``.

Semantics (DESIGN.md, "Observation clustering"): an observation joins the *most similar* existing cluster of the
same task type whose prototype (its first member) has ``difflib.SequenceMatcher(None, observation,
prototype).ratio() >= δ`` (default autojunk, the call the reference scan makes); ties go to the oldest cluster
(lowest id); if none qualifies, a new cluster opens with the observation as prototype. An observation seen before
keeps the cluster it got the first time (identical anchors share a step group) while that cluster lives.

The default, ``exact=True``, decides exactly that (no missed join, no wrong winner) with a cascade of upper bounds
on difflib's match count M (ratio = 2M/(la + lb)), each of which only discards prototypes that cannot qualify:

1. repeats: a dict from (task type, observation) to cluster id (about 1 µs);
2. character histograms of the task type's prototypes, vectorised (numpy): M <= LCS <= Σ_c min(count_a(c),
   count_b(c)) (difflib's quick_ratio). Since M <= min(la, lb), only prototypes whose length lies in a window
   around the query's (2·min(la, lb)/(la + lb) >= δ) can qualify; prototypes are kept sorted by length
   (:class:`~slea.experience.prototypes._Table`), so this step reads that window's slice, not the whole task type;
3. the LCS itself: rapidfuzz ``LCSseq.similarity`` (bit-parallel in C, banded by the integer cutoff of the matches
   needed, so no float edge). difflib's matching blocks form a common subsequence, so M <= LCS. Prototypes go
   best histogram bound first; the first to pass is refined until it provably reaches δ, and its ratio so far
   becomes the floor the rest must reach, which ends the scan at the first histogram bound below it;
4. the exact count, raced: the survivors' matching-block recursions
   (:class:`~slea.experience.textmatch._Match`: difflib's own, each rectangle's longest block found by the
   compiled ``cydifflib``, bit-identical) are refined one rectangle at a time, always the one with the highest
   upper bound, until one is provably the most similar or none reaches δ.

Step 2 still reads every prototype in the length window — no exact filter can do much less, since at δ = 0.85 two
texts can qualify without sharing any 4 consecutive characters — so its cost (and that of step 3 where histograms
look alike) grows with the clusters of one task type (bench/retrieval.py measures it). ``exact=False`` replaces
step 2 by an inverted index over word features whose cost does not grow; it may miss a qualifying prototype (and
then open a cluster), never joins one below δ.

At most ``max_clusters`` live clusters: the least recently used is evicted when a new one opens; evicted ids are
never reused nor matched again. State persists to SQLite (``obs_clusters``, ``obs_memo``, ``obs_meta``) or a dict.
"""

from __future__ import annotations

import json
import sqlite3
from array import array
from collections import Counter
from collections.abc import Iterator
from itertools import chain, repeat
from operator import mul, xor
from typing import Any
from zlib import crc32

from rapidfuzz.distance import LCSseq

from slea.experience.prototypes import _Table
from slea.experience.textmatch import PreparedText, _Match, _need, difflib_ratio, fast_ratio, matching_count

__all__ = ["ObservationIndex", "PreparedText", "difflib_ratio", "fast_ratio", "matching_count"]

_NP_SLACK = 1e-6  # the histogram bound compares with δ minus this (float rounding of 2M/(la+lb) >= δ)


# -- exact=False: word-feature candidate filter ---------------------------------------------------------------
_MIX = 0x9E3779B1  # odd 32-bit multiplier: mixes a bigram's first word into the low bits, stays below 2**64
_SMALL = 48  # texts with more features are indexed and looked up by a 1-in-8 sample


def _features(text: str) -> set[int]:
    """Word unigrams and bigrams (character trigrams too for texts of a few words) and the first/last 6 characters,
    as CRC-32 based ints: deterministic across processes and small in the postings."""
    b = text.encode("utf-8", "surrogatepass")
    toks = b.split()
    h = list(map(crc32, toks))
    f = set(h)
    f.update(map(xor, map(mul, h, repeat(_MIX)), h[1:]))
    if len(toks) <= 4:
        f.update([crc32(b[i:i + 3], 0x5BD1E995) for i in range(len(b) - 2)])
    if b:
        f.add(crc32(b[:6], 1) | (1 << 33))
        f.add(crc32(b[-6:], 2) | (1 << 34))
    if len(f) > _SMALL:  # content-defined sample, which near-duplicates share in proportion to what they share
        f = {x for x in f if not x & 7}
    return f


class _Postings:
    """Feature -> ids of the clusters whose prototype has it (oldest first; the most recent ``cap``), one task
    type. Evicted ids stay until pushed out (candidates are checked for liveness); an empty text is feature 0."""

    __slots__ = ("cap", "post")

    def __init__(self, cap: int) -> None:
        self.post: dict[int, array] = {}
        self.cap = cap

    def add(self, cid: int, text: str) -> None:
        for f in _features(text) or (0,):
            v = self.post.get(f)
            if v is None:
                self.post[f] = array("q", (cid,))  # arrays: compact, not tracked by the garbage collector
            else:
                if len(v) >= self.cap:
                    del v[0]
                v.append(cid)

    def candidates(self, text: str, max_candidates: int, budget: int) -> list[int]:
        """The clusters sharing the most of the query's rarest features, counted within a fixed work budget."""
        lists = sorted((v for f in (_features(text) or (0,)) if (v := self.post.get(f)) is not None), key=len)
        take = []
        for v in lists:
            if budget <= 0 and take:
                break
            take.append(v)
            budget -= len(v)
        counts = Counter(chain.from_iterable(reversed(v) for v in take))  # ties: the most recent
        return [c for c, _ in counts.most_common(max_candidates)]


def _race(race: dict[int, tuple[_Match, int, int]]) -> tuple[int, int]:
    """The cluster with the highest exact difflib ratio >= δ among the survivors (ties: lowest id), or -1.

    Each survivor's match count lies in [total so far, min(total + pending, LCS)]; the survivor with the highest
    upper bound is refined one rectangle at a time (largest first) until its lower bound beats every rival's
    upper bound (or it is exact and still on top), so a clear winner costs a few rectangles, not a full ratio.
    Returns (winner, rectangles refined).
    """
    steps = 0
    while race:
        lead, lead_ub, lead_lb, rival = -1, -1.0, -1.0, -1.0
        for cid in sorted(race):  # ascending ids: among equal bounds the oldest leads
            m, total, need = race[cid]
            u = m.ub()
            if u < need:
                del race[cid]
                continue
            ur = 2.0 * u / total if total else 1.0
            if ur > lead_ub:
                rival = max(rival, lead_ub)
                lead, lead_ub, lead_lb = cid, ur, 2.0 * m.total / total if total else 1.0
            else:
                rival = max(rival, ur)
        if lead < 0:
            return -1, steps
        m, _, need = race[lead]
        if not m.heap or (lead_lb > rival and m.total >= need):
            return lead, steps
        m.step()
        steps += 1
    return -1, steps


def _text(observation: object) -> str:
    return observation if isinstance(observation, str) else "" if observation is None else str(observation)


class ObservationIndex:
    """Observation → cluster id, with difflib-ratio semantics at threshold δ, scoped by task type.

    ``assign`` is the only mutating call the rollout needs; ``lookup`` answers without creating or touching.
    ``exact=False`` switches to the approximate word-feature candidate filter (``max_candidates`` / ``work_budget``
    / ``posting_cap`` tune it; they are ignored in exact mode). ``prepared_cache`` bounds the cached difflib
    preparations of prototypes, ``memo_size`` the exact-repeat dict.
    """

    def __init__(self, threshold: float = 0.85, max_clusters: int = 100_000, *, exact: bool = True,
                 memo_size: int = 200_000, prepared_cache: int = 16384,
                 max_candidates: int | None = None, posting_cap: int = 256, work_budget: int | None = None) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        if max_clusters < 1:
            raise ValueError("max_clusters must be >= 1")
        self.threshold = float(threshold)
        self.max_clusters = int(max_clusters)
        self.exact = bool(exact)
        self.memo_size = int(memo_size)
        self.prepared_cache = int(prepared_cache)
        self.max_candidates = int(max_candidates if max_candidates is not None else 6)
        self.posting_cap = int(posting_cap)
        self.work_budget = int(work_budget if work_budget is not None else 128)
        self._half = (self.threshold - _NP_SLACK) / 2.0
        self._next_id = 0
        self._proto: dict[int, str] = {}
        self._scope_of: dict[int, str] = {}
        self._size: dict[int, int] = {}
        self._lru: dict[int, None] = {}  # insertion order = recency (oldest first)
        self._tick: dict[int, int] = {}  # last use, on a counter (persisted: it restores the LRU order)
        self._clock = 0
        self._memo: dict[tuple[str, str], int] = {}
        self._prep: dict[int, PreparedText] = {}
        self._tables: dict[str, _Table] = {}
        self._postings: dict[str, _Postings] = {}
        # persistence bookkeeping (what changed since the last save)
        self._dirty: set[int] = set()
        self._evicted: set[int] = set()
        self._memo_added: dict[tuple[str, str], int] = {}
        self._memo_dropped: set[tuple[str, str]] = set()
        self.stats: Counter = Counter()

    # -- public API --------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._proto)

    def __contains__(self, cid: object) -> bool:
        return cid in self._proto

    def prototype(self, cid: int) -> str | None:
        return self._proto.get(cid)

    def task_type_of(self, cid: int) -> str | None:
        return self._scope_of.get(cid)

    def size(self, cid: int) -> int:
        return self._size.get(cid, 0)

    def clusters(self) -> Iterator[tuple[int, str, str, int]]:
        """(cluster id, task type, prototype, member count), least recently used first."""
        for cid in self._lru:
            yield cid, self._scope_of[cid], self._proto[cid], self._size[cid]

    def assign(self, observation: str, task_type: str = "") -> int:
        """The cluster of ``observation`` (joining the best qualifying cluster or opening a new one)."""
        observation = _text(observation)
        key = (task_type, observation)
        cid = self._memo.get(key)
        if cid is not None and cid in self._proto:
            self.stats["memo"] += 1
            self._touch(cid)
            return cid
        cid = self._search(observation, task_type)
        if cid < 0:
            cid = self._create(observation, task_type)
        else:
            self._size[cid] += 1
            self._touch(cid)
        self._remember(key, cid)
        return cid

    def lookup(self, observation: str, task_type: str = "") -> int:
        """The cluster ``assign`` would join, or -1 where it would open a new one; changes nothing."""
        observation = _text(observation)
        cid = self._memo.get((task_type, observation))
        if cid is not None and cid in self._proto:
            return cid
        return self._search(observation, task_type, record=False)

    # -- search ------------------------------------------------------------------------------------------------
    def _search(self, observation: str, task_type: str, record: bool = True) -> int:
        table = self._tables.get(task_type)
        if table is None or not len(table):
            return -1
        if self.exact:
            rows, ubs = table.bounded(observation, self._half)
        else:
            cands = self._postings[task_type].candidates(observation, self.max_candidates, self.work_budget)
            rows, ubs = [table.row[c] for c in cands if c in table.row], None
        best, counts = self._best(observation, table, rows, ubs)
        if record:
            self.stats.update(searched=1, bounded=counts[0], lcs_passed=counts[1], exact_steps=counts[2])
        return best

    def _best(self, a: str, table: _Table, rows: list[int], ubs: list[float] | None = None
              ) -> tuple[int, tuple[int, int, int]]:
        """The most similar qualifying prototype among ``rows`` (-1 if none), and (rows, LCS survivors, steps).

        With ``ubs`` (rows sorted by an upper bound of their ratio, best first), the first prototype that passes
        the LCS bound is refined until it provably reaches δ: its ratio so far (a lower bound of its exact one)
        is then the floor every later row must reach (a row below it can neither beat nor tie it), and the scan
        ends at the first bound under the floor.
        """
        la = len(a)
        texts, cids = table.texts, table.cids
        lcs = LCSseq.similarity
        floor = self.threshold
        race = {}  # cid -> (difflib's matching-block recursion capped by the LCS, la + lb, matches needed)
        steps = seen = 0
        for k, r in enumerate(rows):
            if ubs is not None and ubs[k] < floor:
                break
            seen += 1
            b = texts[r]
            total = la + len(b)
            need = _need(floor, total)
            cap = lcs(a, b, score_cutoff=need)  # C, banded by the integer cutoff; 0 below it
            if not (cap or not total) or cap < need:
                continue
            cid = cids[r]
            m = _Match(a, self._prepared(cid), cap)
            race[cid] = (m, total, need)
            if ubs is not None and len(race) == 1:  # the leader so far: refined until it provably qualifies
                while m.heap and m.total < need <= m.ub():
                    m.step()
                    steps += 1
                if m.total >= need:
                    floor = 2.0 * m.total / total if total else 1.0  # at most its exact ratio
                else:
                    del race[cid]
        if not race:
            return -1, (seen, 0, steps)
        best, more = _race(race)
        return best, (seen, len(race), steps + more)

    def _prepared(self, cid: int) -> PreparedText:
        p = self._prep.get(cid)
        if p is None:
            p = PreparedText(self._proto[cid])
            if len(self._prep) >= self.prepared_cache:
                del self._prep[next(iter(self._prep))]
            self._prep[cid] = p
        return p

    # -- bookkeeping -------------------------------------------------------------------------------------------
    def _touch(self, cid: int) -> None:
        lru = self._lru
        del lru[cid]
        lru[cid] = None
        self._clock += 1
        self._tick[cid] = self._clock
        self._dirty.add(cid)

    def _remember(self, key: tuple[str, str], cid: int) -> None:
        memo = self._memo
        memo[key] = cid
        self._memo_added[key] = cid
        self._memo_dropped.discard(key)
        if len(memo) > self.memo_size:
            old = next(iter(memo))
            del memo[old]
            self._memo_added.pop(old, None)
            self._memo_dropped.add(old)

    def _create(self, observation: str, task_type: str) -> int:
        cid = self._next_id
        self._next_id += 1
        self.stats["created"] += 1
        self._add_cluster(cid, task_type, observation, 1)
        while len(self._proto) > self.max_clusters:
            self._evict(next(iter(self._lru)))
        return cid

    def _add_cluster(self, cid: int, task_type: str, prototype: str, size: int, tick: int | None = None) -> None:
        self._proto[cid] = prototype
        self._scope_of[cid] = task_type
        self._size[cid] = size
        self._lru[cid] = None
        if tick is None:
            self._clock += 1
            tick = self._clock
        self._tick[cid] = tick
        self._dirty.add(cid)
        self._evicted.discard(cid)
        table = self._tables.get(task_type)
        if table is None:
            table = self._tables[task_type] = _Table()
        table.add(cid, prototype, self._half * len(prototype))
        if not self.exact:
            post = self._postings.get(task_type)
            if post is None:
                post = self._postings[task_type] = _Postings(self.posting_cap)
            post.add(cid, prototype)

    def _evict(self, cid: int) -> None:
        self.stats["evicted"] += 1
        del self._lru[cid]
        del self._proto[cid]
        self._tables[self._scope_of.pop(cid)].remove(cid)
        del self._size[cid]
        del self._tick[cid]
        self._prep.pop(cid, None)
        self._dirty.discard(cid)
        self._evicted.add(cid)
        # postings and memo entries keep the dead id lazily: every read checks liveness, ids are never reused

    # -- persistence -------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """A JSON-able snapshot (clusters in recency order, memo, counters)."""
        return {
            "threshold": self.threshold, "max_clusters": self.max_clusters, "next_id": self._next_id,
            "clock": self._clock,
            "clusters": [[cid, t, p, n, self._tick[cid]] for cid, t, p, n in self.clusters()],
            "memo": [[t, o, c] for (t, o), c in self._memo.items() if c in self._proto],
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any], **kwargs: Any) -> ObservationIndex:
        kwargs.setdefault("threshold", state.get("threshold", 0.85))
        kwargs.setdefault("max_clusters", state.get("max_clusters", 100_000))
        idx = cls(**kwargs)
        idx._load(state.get("next_id", 0), state.get("clusters", []), state.get("memo", []),
                  state.get("clock", 0))
        return idx

    def _load(self, next_id: int, clusters: list, memo: list, clock: int = 0) -> None:
        for row in sorted(clusters, key=lambda r: (r[4], r[0]) if len(r) > 4 else (0, r[0])):  # oldest first
            tick = int(row[4]) if len(row) > 4 else None
            self._add_cluster(int(row[0]), row[1], row[2], int(row[3]), tick)
        self._clock = max([self._clock, int(clock)] + list(self._tick.values()))
        while len(self._proto) > self.max_clusters:
            self._evict(next(iter(self._lru)))
        self._next_id = max([int(next_id)] + [c + 1 for c in self._proto])
        for t, o, c in memo:
            if c in self._proto:
                self._memo[(t, o)] = int(c)
        self._mark_clean()

    def _mark_clean(self) -> None:
        self._dirty.clear()
        self._evicted.clear()
        self._memo_added.clear()
        self._memo_dropped.clear()

    _SCHEMA = """
    CREATE TABLE IF NOT EXISTS obs_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS obs_clusters (
        cid INTEGER PRIMARY KEY, task_type TEXT NOT NULL, prototype TEXT NOT NULL,
        size INTEGER NOT NULL, recency INTEGER NOT NULL);
    CREATE TABLE IF NOT EXISTS obs_memo (
        task_type TEXT NOT NULL, observation TEXT NOT NULL, cid INTEGER NOT NULL,
        PRIMARY KEY (task_type, observation));
    """

    def save_sqlite(self, conn: sqlite3.Connection) -> None:
        """Write what changed since the last save/load. The caller owns the transaction (commit)."""
        for stmt in self._SCHEMA.split(";"):
            if stmt.strip():
                conn.execute(stmt)
        meta = {"threshold": self.threshold, "max_clusters": self.max_clusters, "next_id": self._next_id,
                "clock": self._clock}
        conn.executemany("INSERT OR REPLACE INTO obs_meta(key, value) VALUES (?, ?)",
                         [(k, json.dumps(v)) for k, v in meta.items()])
        if self._evicted:
            conn.executemany("DELETE FROM obs_clusters WHERE cid = ?", [(c,) for c in self._evicted])
            conn.executemany("DELETE FROM obs_memo WHERE cid = ?", [(c,) for c in self._evicted])
        if self._dirty:
            rows = [(cid, self._scope_of[cid], self._proto[cid], self._size[cid], self._tick[cid])
                    for cid in self._dirty if cid in self._proto]
            conn.executemany("INSERT OR REPLACE INTO obs_clusters(cid, task_type, prototype, size, recency) "
                             "VALUES (?, ?, ?, ?, ?)", rows)
        if self._memo_dropped:
            conn.executemany("DELETE FROM obs_memo WHERE task_type = ? AND observation = ?",
                             list(self._memo_dropped))
        if self._memo_added:
            conn.executemany("INSERT OR REPLACE INTO obs_memo(task_type, observation, cid) VALUES (?, ?, ?)",
                             [(t, o, c) for (t, o), c in self._memo_added.items() if c in self._proto])
        self._mark_clean()

    @classmethod
    def load_sqlite(cls, conn: sqlite3.Connection, **kwargs: Any) -> ObservationIndex:
        """Rebuild an index from the tables written by :meth:`save_sqlite` (empty index if there are none)."""
        have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "obs_clusters" not in have:
            return cls(**kwargs)
        meta = {k: json.loads(v) for k, v in conn.execute("SELECT key, value FROM obs_meta")}
        kwargs.setdefault("threshold", meta.get("threshold", 0.85))
        kwargs.setdefault("max_clusters", meta.get("max_clusters", 100_000))
        idx = cls(**kwargs)
        clusters = conn.execute("SELECT cid, task_type, prototype, size, recency FROM obs_clusters").fetchall()
        memo = conn.execute("SELECT task_type, observation, cid FROM obs_memo").fetchall()
        idx._load(meta.get("next_id", 0), clusters, memo, meta.get("clock", 0))
        return idx
