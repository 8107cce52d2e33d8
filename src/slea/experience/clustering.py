"""Observation clustering for SLEA-RL (paper §3.3): ``c(o) = c_i if sim(o, rep(c_i)) >= δ else new cluster``.

Semantics (DESIGN.md, "Observation clustering"): an observation joins the *most similar* existing cluster of the
same task type whose prototype (its first member) has ``difflib.SequenceMatcher(None, observation,
prototype).ratio() >= δ``; ties go to the oldest cluster; if none qualifies a new cluster opens with the
observation as prototype. An observation seen before keeps the cluster it got the first time (so identical
anchors always share a cluster, which step grouping relies on), as long as that cluster is alive.

The index never scans every cluster:

1. exact-repeat fast path: a dict from (task type, observation) to cluster id;
2. candidate filter: an inverted index from word unigrams/bigrams of the prototypes to cluster ids; a query
   counts hits over its rarest features only (a fixed work budget; a feature shared by more than
   ``posting_cap`` prototypes keeps only the most recent ones and is used only when nothing rarer is shared),
   so the cost does not grow with the number of clusters;
3. cheap upper bounds on the ratio, most selective last: the length bound ``2·min/(la+lb)`` (difflib's
   ``real_quick_ratio``) and ``2·(P + S + min(middles))/(la+lb)`` with P, S the common prefix/suffix (the LCS, and
   so difflib's match count, never exceeds it), which prunes almost every non-winner;
4. exact ratio, in decreasing bound order, with early exit once a candidate cannot beat the best so far. The exact
   ratio is :func:`~slea.experience.textmatch.fast_ratio` (slea/experience/textmatch.py): difflib's own
   matching-block algorithm, bit-identical, with C-level block search and early exit.

Bounded: at most ``max_clusters`` live clusters; the least recently used one is evicted when a new one opens.
Evicted ids are never reused and never matched again (every candidate and memo hit is checked for liveness).
State persists to SQLite tables (``obs_clusters``, ``obs_memo``, ``obs_meta``) or a plain dict.
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

from slea.experience.textmatch import (
    _LCS_MAX,
    PreparedText,
    _Match,
    _need,
    difflib_ratio,
    fast_ratio,
    lcs_length,
    matching_count,
)

__all__ = [
    "ObservationIndex",
    "PreparedText",
    "difflib_ratio",
    "fast_ratio",
    "matching_count",
]


# ---------------------------------------------------------------------------------------------------------------
# The index
# ---------------------------------------------------------------------------------------------------------------
def _gate(threshold: float, n_features: int) -> float:
    """Least word-feature Dice a pair at difflib ratio >= threshold shows in practice (non-exact mode only).

    Calibrated on TextWorld observations (bench/retrieval.py re-measures the agreement): a pair at ratio 0.85
    differs in at most ~15% of its characters, i.e. a few words, which costs each changed word one unigram and
    two bigrams; short texts lose a larger share. Pairs below this Dice are skipped without an exact ratio.
    """
    g = threshold - 0.1 - 13.0 * (1.0 - threshold) / (n_features ** 0.5 if n_features else 1.0)
    return max(0.0, g)


def _features(text: str) -> set[int]:
    """Word unigrams and bigrams; texts of a few words also get character trigrams (a one-word edit there is
    a large share of the text); every text gets its first and last 6 characters. Features are CRC-32 based
    ints — deterministic across processes (Python's str hash is salted per process), small in the postings
    and invisible to the garbage collector — computed with C-level maps only."""
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
    return f


_MIX = 0x9E3779B1  # odd 32-bit multiplier: mixes a bigram's first word into the low bits, stays below 2**64
_SMALL = 48  # texts with more features are represented (indexed, looked up, compared) by a 1-in-8 sample


def _sketch(feats: set[int]) -> set[int]:
    """The features a text is indexed and looked up by: all of them for small texts, else the content-defined
    1-in-8 sample (hash & 7 == 0), which near-duplicates share in proportion to what they share overall."""
    if len(feats) <= _SMALL:
        return feats
    return {h for h in feats if not h & 7}


class _Scope:
    """Per-task-type candidate structures."""

    __slots__ = ("bare", "postings")

    def __init__(self) -> None:
        self.postings: dict[int, int | array] = {}  # feature -> cluster id, or ids (oldest first)
        self.bare: list[int] = []  # prototypes with no word feature (empty or whitespace-only)


class ObservationIndex:
    """Observation → cluster id, with difflib-ratio semantics at threshold δ, scoped by task type.

    ``assign`` is the only mutating call the rollout needs; ``lookup`` answers without creating or touching.
    Parameters beyond ``threshold`` and ``max_clusters`` tune speed vs. exhaustiveness of the candidate filter
    (bench/retrieval.py measures both). ``max_candidates`` / ``work_budget`` default to 6 / 128 and to the wider
    12 / 256 in ``exact`` mode, which trades speed for agreement with the plain scan.
    """

    def __init__(self, threshold: float = 0.85, max_clusters: int = 100_000, *, exact: bool = False,
                 memo_size: int = 200_000, prepared_cache: int = 16384,
                 max_candidates: int | None = None, posting_cap: int = 256, work_budget: int | None = None) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        if max_clusters < 1:
            raise ValueError("max_clusters must be >= 1")
        self.threshold = float(threshold)
        self.max_clusters = int(max_clusters)
        self.exact = bool(exact)
        self._sketch: dict[int, tuple[int, array]] = {}  # cid -> (feature count, sketch)
        self.memo_size = int(memo_size)
        self.prepared_cache = int(prepared_cache)
        self.max_candidates = int(max_candidates if max_candidates is not None else 12 if exact else 6)
        self.posting_cap = int(posting_cap)
        self.work_budget = int(work_budget if work_budget is not None else 256 if exact else 128)
        self._next_id = 0
        self._proto: dict[int, str] = {}
        self._scope_of: dict[int, str] = {}
        self._size: dict[int, int] = {}
        self._lru: dict[int, None] = {}  # insertion order = recency (oldest first)
        self._tick: dict[int, int] = {}  # last use, on a counter (persisted: it restores the LRU order)
        self._clock = 0
        self._memo: dict[tuple[str, str], int] = {}
        self._prep: dict[int, PreparedText] = {}
        self._scopes: dict[str, _Scope] = {}
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
        if not isinstance(observation, str):
            observation = "" if observation is None else str(observation)
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
        if not isinstance(observation, str):
            observation = "" if observation is None else str(observation)
        cid = self._memo.get((task_type, observation))
        if cid is not None and cid in self._proto:
            return cid
        return self._search(observation, task_type, record=False)

    # -- internals ---------------------------------------------------------------------------------------------
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

    def _prepared(self, cid: int) -> PreparedText:
        p = self._prep.get(cid)
        if p is None:
            p = PreparedText(self._proto[cid])
            if len(self._prep) >= self.prepared_cache:
                del self._prep[next(iter(self._prep))]
            self._prep[cid] = p
        return p

    def _candidates(self, feats: set[int], n_features: int, scope: _Scope) -> list[int]:
        post = scope.postings
        cap = self.posting_cap
        singles: list[int] = []  # features held by one cluster: the rarest of all
        lists = []
        full = None
        for f in feats:
            v = post.get(f)
            if v is None:
                continue
            if v.__class__ is int:
                singles.append(v)
            elif len(v) < cap:
                lists.append(v)
            elif full is None:
                full = v
        if n_features <= 2 and scope.bare:
            lists.append(scope.bare)
        if not lists and not singles:
            # every shared feature is saturated (many clusters alike): the most recent clusters sharing one
            return full[-self.max_candidates:] if full is not None else []
        lists.sort(key=len)
        budget = self.work_budget - len(singles)
        take = 0
        for lst in lists:
            if budget <= 0:
                break
            budget -= len(lst)
            take += 1
        counts = Counter(chain(singles, chain.from_iterable(lists[:take])))
        if len(counts) <= self.max_candidates:
            return list(counts)
        return [c for c, _ in counts.most_common(self.max_candidates)]

    def _search(self, observation: str, task_type: str, record: bool = True) -> int:
        scope = self._scopes.get(task_type)
        if scope is None:
            return -1
        feats = _features(observation)
        nf = len(feats)
        qs = _sketch(feats)
        cands = self._candidates(qs, nf, scope)
        if not cands:
            return -1
        q8 = qs if nf > _SMALL else None  # the query's 1-in-8 sample, made on demand
        a = observation
        la = len(a)
        thr = self.threshold
        proto = self._proto
        gate = not self.exact
        ranked = []
        for cid in cands:
            b = proto.get(cid)
            if b is None:  # evicted
                continue
            lb = len(b)
            if 2.0 * (min(lb, la)) / (la + lb) < thr:  # length bound (difflib's real_quick_ratio)
                continue
            n_p, sk = self._sketch[cid]
            tot = nf + n_p
            if nf <= _SMALL and n_p <= _SMALL:  # both sketches are the full feature sets: exact Dice
                dice = 2.0 * len(feats.intersection(sk)) / tot if tot else 1.0
            else:  # estimate on the common 1-in-8 sample
                if q8 is None:
                    q8 = {h for h in feats if not h & 7}
                p8 = sk if n_p > _SMALL else [h for h in sk if not h & 7]
                den = len(q8) + len(p8)
                dice = 2.0 * len(q8.intersection(p8)) / den if den else 0.0
            if gate and dice < _gate(thr, tot):
                continue
            ranked.append((-dice, cid))
        if not ranked:
            return -1
        # race the candidates on rigorous bounds of their match counts: refine the one with the highest upper
        # bound until one is certainly the most similar (or none can reach δ)
        race: dict[int, tuple[_Match, int, int]] = {}  # cid -> (matcher, a+b length, matches needed for δ)
        for _, cid in ranked:
            lb = len(proto[cid])
            total = la + lb
            need = _need(thr, total)
            p = self._prepared(cid)
            # rigorous: LCS >= difflib's matches (tight without popular elements; with them it rarely prunes)
            cap = lcs_length(a, p) if (lb <= _LCS_MAX and not p.popular) else None
            if cap is not None and cap < need:
                continue
            race[cid] = (_Match(a, p, cap), total, need)
        steps = 0
        best = -1
        while race:
            lead, lead_ub, lead_lb, rival = -1, -1.0, -1.0, -1.0
            for cid in sorted(race):
                m, total, need = race[cid]
                u = m.ub()
                if u < need:
                    del race[cid]
                    continue
                ur = 2.0 * u / total if total else 1.0
                if ur > lead_ub:
                    if lead >= 0:
                        rival = max(rival, lead_ub)
                    lead, lead_ub, lead_lb = cid, ur, 2.0 * m.total / total if total else 1.0
                else:
                    rival = max(rival, ur)
            if lead < 0:
                break
            m, total, need = race[lead]
            if not m.heap or (lead_lb > rival and m.total >= need):
                best = lead  # exact and >= every other bound, or already provably above all of them
                break
            m.step()
            steps += 1
        if record:
            self.stats["searched"] += 1
            self.stats["exact_steps"] += steps
        return best

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
        scope = self._scopes.get(task_type)
        if scope is None:
            scope = self._scopes[task_type] = _Scope()
        full = _features(prototype)
        feats = _sketch(full)
        self._sketch[cid] = (len(full), array("Q", feats))
        if not feats:
            scope.bare.append(cid)
            return
        post = scope.postings
        cap = self.posting_cap
        for f in feats:
            v = post.get(f)
            if v is None:
                post[f] = cid
            elif v.__class__ is int:
                post[f] = array("q", (v, cid))  # arrays: compact, and not tracked by the garbage collector
            else:
                if len(v) >= cap:  # a saturated feature keeps the most recent `cap` clusters
                    del v[0]
                v.append(cid)

    def _evict(self, cid: int) -> None:
        self.stats["evicted"] += 1
        del self._lru[cid]
        del self._proto[cid]
        scope = self._scopes[self._scope_of.pop(cid)]
        del self._size[cid]
        del self._tick[cid]
        self._prep.pop(cid, None)
        del self._sketch[cid]
        self._dirty.discard(cid)
        self._evicted.add(cid)
        if scope.bare and cid in scope.bare:
            scope.bare.remove(cid)
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

    @classmethod
    def create_tables(cls, conn: sqlite3.Connection) -> None:
        conn.executescript(cls._SCHEMA)

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
