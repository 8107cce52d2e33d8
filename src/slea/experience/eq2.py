"""Eq.2's similarity, exact over the whole library and fast (SLEA-RL Eq.2; sim defined in retrieval.py).

``sim(q, e) = hit(q, e) / W(e)``: ``hit`` is the idf of the entry's content tokens that occur in the query,
``W(e)`` the idf of all of them, with ``idf = log(1 + n / (1 + df))`` over the library's n entries.

:class:`TokenMatrix` holds the library's tokens as numpy postings (entry rows per token), built once per library
content version. A query concatenates its tokens' postings and sums their idf per entry with one weighted
``bincount`` — dense over the library when the postings are long, over their distinct entries when they are short
(then the cost does not grow with the library). Every entry is scored: there is no candidate filter.

(Tried and dropped, 2026-12-01: treating the frequent tokens apart — a dense matrix, with only the entries whose
frequent tokens alone could pass the threshold as extra candidates — is exact, but on TextWorld-like libraries
(a 721-token vocabulary at 10k entries) 83 % of the entries are such candidates, and it ran 5x slower.)

No entry that passes the threshold is left out (tests/experience/test_retrieval.py checks it against a plain scan).
"""

from __future__ import annotations

import numpy as np

from slea.experience.library import ExperienceLibrary

ZONE_CODES = {"pos": 0, "neg": 1}


class TokenMatrix:
    """Entries x content tokens of one library content version (immutable)."""

    def __init__(self, lib: ExperienceLibrary) -> None:
        self.version = lib.content_version
        entries = sorted(lib.entries(), key=lambda e: e.id)
        self.n = n = len(entries)
        self.eids = np.array([e.id for e in entries], dtype=np.int64)
        row = {e.id: i for i, e in enumerate(entries)}
        self.task_codes: dict[str, int] = {}
        self.task = np.array([self.task_codes.setdefault(e.task_type, len(self.task_codes)) if e.task_type else -1
                              for e in entries], dtype=np.int64)  # -1: untyped, retrieved for every task type
        self.zone = np.array([ZONE_CODES[e.zone] for e in entries], dtype=np.int8)
        self.token_ids: dict[str, int] = {}
        self.postings: list[np.ndarray] = []
        for tok, ids in lib.posting_items():
            self.token_ids[tok] = len(self.postings)
            self.postings.append(np.fromiter((row[e] for e in ids), dtype=np.int64, count=len(ids)))
        self.df = np.array([len(p) for p in self.postings], dtype=np.int64)
        self.idf = np.log1p(n / (1.0 + self.df))
        self.weight = np.bincount(np.concatenate(self.postings), weights=np.repeat(self.idf, self.df),
                                  minlength=n) if self.postings else np.zeros(n)
        self._tw: dict[float, np.ndarray] = {}

    def _threshold_weight(self, threshold: float) -> np.ndarray:
        """``threshold * W(e)``, a hair lower so that rounding never drops an entry before the exact test."""
        tw = self._tw.get(threshold)
        if tw is None:
            tw = self._tw[threshold] = threshold * self.weight * (1.0 - 1e-12)
        return tw

    def above(self, tokens, threshold: float) -> tuple[np.ndarray, np.ndarray]:
        """(rows, sims) of every entry with ``sim > threshold`` for a query with these content tokens."""
        tids = [i for i in map(self.token_ids.get, tokens) if i is not None]
        if not tids:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        rows = np.concatenate([self.postings[i] for i in tids])
        tids = np.asarray(tids, dtype=np.int64)
        w = np.repeat(self.idf[tids], self.df[tids])
        if rows.size * 64 > self.n:  # long postings (sorting them costs more): one dense pass over the library
            dense = np.bincount(rows, weights=w, minlength=self.n)
            cand = np.flatnonzero(dense > self._threshold_weight(threshold))
            hit = dense[cand]
        else:  # short ones: only the entries they name
            cand = np.unique(rows)
            hit = np.bincount(np.searchsorted(cand, rows), weights=w, minlength=cand.size)
        w = self.weight[cand]
        sim = np.divide(hit, w, out=np.zeros_like(hit), where=w > 0)
        keep = sim > threshold
        return cand[keep], sim[keep]


def best_per_zone(cand: np.ndarray, sim: np.ndarray, zone: np.ndarray, per_zone: dict[str, int]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The candidates that can be among their zone's best k by similarity: every one at or above the zone's
    k-th largest similarity (ties kept, for the score and id tie-break)."""
    keep = np.zeros(cand.size, dtype=bool)
    z = zone[cand]
    for name, code in ZONE_CODES.items():
        k = per_zone.get(name, 0)
        if k <= 0:
            continue
        mine = np.flatnonzero(z == code)
        if mine.size > k:
            kth = np.partition(sim[mine], mine.size - k)[mine.size - k]
            mine = mine[sim[mine] >= kth]
        keep[mine] = True
    return cand[keep], sim[keep]
