"""Eq.2's similarity, exact over the whole library and fast (SLEA-RL Eq.2; sim defined in retrieval.py).

``sim(q, e) = hit(q, e) / W(e)``: ``hit`` is the idf of the entry's content tokens that occur in the query,
``W(e)`` the idf of all of them, with ``idf = log(1 + n / (1 + df))`` over the library's n entries.

:class:`TokenMatrix` holds the library's tokens as numpy postings (entry rows per token), built once per library
content version. A query concatenates its tokens' postings and sums their idf per entry with one weighted
``bincount`` — dense over the library when the postings are long, over their distinct entries when they are short
(then the cost does not grow with the library). The most frequent tokens (in at least 1/8 of the entries, at most
64 of them, 64 MiB) are dense rows ``idf * [token in entry]`` instead, each added to the dense sum in one pass:
from about 1/8 of the library on, a row costs less than concatenating, repeating and scattering its posting ids.
Rows are grouped by task type (untyped first) and postings sorted, so a typed
query scores only the untyped rows and its task type's (slices of the postings and dense rows); each query's
work (its postings slices, idf, lengths, dense rows) is memoised per token tuple and task type. Every sum adds
its idf terms in token-id order, so the scores do not depend on the query's token order or string hashing. Every
entry is scored: there is no candidate filter.

Tried, 2026-12-02 (TextWorld-like library from bench/retrieval.py, 10k entries, 723 tokens, 7 dense rows; its
slowest queries name ~60 tokens and 22-26k posting ids): dense rows from 1/4, 1/8, 1/12, 1/16, 1/32 of the library
(5-55 rows) — 1/8 was the fastest, 1/32 slower than none; sorting each posting (no faster scatter); ``np.add.at``,
a fancy ``+=`` per token, torch ``bincount`` / ``index_add_`` and scipy CSR products in place of ``bincount``
(none cheaper per posting id). A numba kernel (2026-12-02: int32 CSR postings, one fused scatter, prefilter and exact
test; branch `eq2`, not merged) gave 10k mean/p99 57.8/178.1 µs against 79.7/233.7 for this code in the same heavy
run, but 100k mean 431 against 328 µs (a pass over the whole buffer per query), a new compiled dependency and ~0.9 s
of first-call cost; it still missed 100 µs, and about half of the 10k tail was outside the scatter (query
tokenisation, p99 ~99 µs, when the 4096-entry token cache misses). The remaining tail is the mid-frequency tokens (df n/100 to n/8), for which the
postings' scatter is already the cheapest numpy form. Timings: bench/results/retrieval.json.

(Tried and dropped, 2026-12-01: treating the frequent tokens apart — a dense matrix, with only the entries whose
frequent tokens alone could pass the threshold as extra candidates — is exact, but on TextWorld-like libraries
(a 721-token vocabulary at 10k entries) 83 % of the entries are such candidates, and it ran 5x slower.)

Exactness: an entry matched by one query token gets that token's idf exactly (the other rows and postings add
+0.0), so ties at the threshold (two tokens of the same df, one of them in the query: sim = 0.5) fall as in the
plain scan; tests/experience/test_eq2.py checks the dense rows against the postings alone and the scan.
No entry that passes the threshold is left out (tests/experience/test_retrieval.py checks it against a plain scan).
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

from slea.experience.library import ExperienceLibrary

ZONE_CODES = {"pos": 0, "neg": 1}
DENSE_SHARE = 8  # a token in at least 1/8 of the entries gets a dense idf row (cheaper to add than to bincount)
DENSE_MAX_ROWS = 64
DENSE_MAX_BYTES = 64 << 20
TW_MAX = 16  # cached threshold vectors (one per threshold)
PLAN_MAX = 4096  # cached query plans (one per distinct token tuple) per matrix


class TokenMatrix:
    """Entries x content tokens of one library content version (immutable).

    ``dense_share``: tokens in at least ``n / dense_share`` entries (at most ``DENSE_MAX_ROWS`` of them, the most
    frequent, within ``DENSE_MAX_BYTES``) are held as dense float64 rows ``idf * [token in entry]`` and added
    row by row; ``0`` disables them (every token through the postings' bincount, the same entries).

    Rows are grouped by task type (the untyped entries first, then each task type's, ``starts``), and each
    posting is sorted, so a typed query scores only its task type's rows and the untyped ones: two slices of
    every posting and of every dense row, not the whole library.

    Token ids (``token_ids``) fix the order of every sum: the postings tokens in string order, then the dense
    ones in row order. Each entry's ``W(e)`` and each query's ``hit(q, e)`` add their idf terms in token-id order,
    whatever the order of the query's tokens, the grouping or Python's string hashing."""

    def __init__(self, lib: ExperienceLibrary, dense_share: int = DENSE_SHARE) -> None:
        self.version = lib.content_version
        entries = sorted(lib.entries(), key=lambda e: e.id)
        self.task_codes: dict[str, int] = {}
        for e in entries:
            if e.task_type:
                self.task_codes.setdefault(e.task_type, len(self.task_codes))
        codes = self.task_codes
        entries.sort(key=lambda e: codes[e.task_type] if e.task_type else -1)  # stable: by id in each group
        self.n = n = len(entries)
        self.eids = np.array([e.id for e in entries], dtype=np.int64)
        self.task = np.array([codes[e.task_type] if e.task_type else -1 for e in entries],
                             dtype=np.int64)  # -1: untyped, retrieved for every task type
        # group g (0: untyped, 1 + code: a task type) holds rows starts[g]:starts[g + 1]
        self.starts = np.searchsorted(self.task, np.arange(-1, len(codes) + 1))
        self.zone = np.array([ZONE_CODES[e.zone] for e in entries], dtype=np.int8)
        items = sorted((tok, len(ids), ids) for tok, ids in lib.posting_items())
        cap = min(DENSE_MAX_ROWS, DENSE_MAX_BYTES // (8 * max(n, 1))) if dense_share > 0 else 0
        by_df = sorted(range(len(items)), key=lambda i: (-items[i][1], items[i][0]))[:cap]
        freq = [i for i in by_df if items[i][1] * dense_share >= n]
        dense_of = set(freq)
        order = [i for i in range(len(items)) if i not in dense_of] + freq
        self.n_sparse = len(items) - len(freq)
        self.token_ids = {items[i][0]: k for k, i in enumerate(order)}
        lut = np.zeros(int(self.eids.max()) + 1 if n else 0, dtype=np.int64)  # entry id -> row
        lut[self.eids] = np.arange(n)
        self.postings = [np.sort(lut[np.fromiter(items[i][2], dtype=np.int64, count=items[i][1])]) for i in order]
        cut = np.array([np.searchsorted(p, self.starts) for p in self.postings], dtype=np.int64
                       ).reshape(len(order), self.starts.size)  # cut[t, g]: where group g starts in posting t
        # group g's pieces (its -1: every row), numbered in token-id order: pieces[g] maps a token to its
        # number, views[g] / lens[g] / tids[g] hold the slice of the token's posting there, its length, its id
        nz = np.nonzero(cut[:, 1:] > cut[:, :-1])
        tok_of = [items[i][0] for i in order]
        self.pieces: list[dict[str, int]] = []
        self.views: list[list[np.ndarray]] = []
        self.lens: list[np.ndarray] = []
        self.tids: list[list[int]] = []
        for g in [*range(self.starts.size - 1), -1]:
            ts = np.arange(len(order)) if g < 0 else np.sort(nz[0][nz[1] == g])
            a, b = (np.zeros_like(ts), cut[:, -1]) if g < 0 else (cut[ts, g], cut[ts, g + 1])
            self.pieces.append({tok_of[t]: k for k, t in enumerate(ts.tolist())})
            self.views.append([self.postings[t][i:j] for t, i, j in zip(ts.tolist(), a.tolist(), b.tolist())])
            self.lens.append(b - a)
            self.tids.append(ts.tolist())
        self.first_dense = [bisect_left(t, self.n_sparse) for t in self.tids]  # per group: its first dense piece
        self.df = np.array([items[i][1] for i in order], dtype=np.int64)
        self.idf = np.log1p(n / (1.0 + self.df))
        self.piece_idf = [self.idf[np.asarray(t, dtype=np.int64)] for t in self.tids]
        st = self.starts.tolist()  # the segments a query of each task type scores: (first row, end row, group)
        self._segs = {"": [(0, n, -1)], None: [(st[0], st[1], 0)] if st[1] > st[0] else []}
        for code in range(len(codes)):
            self._segs[entries[st[code + 1]].task_type] = self._segs[None] + [(st[code + 1], st[code + 2], code + 1)]
        self.weight = np.bincount(np.concatenate(self.postings), weights=np.repeat(self.idf, self.df),
                                  minlength=n) if self.postings else np.zeros(n)
        self.dense = np.zeros((len(freq), n))
        for k in range(len(freq)):
            t = self.n_sparse + k
            self.dense[k, self.postings[t]] = self.idf[t]
        self.dense_ids = {tok: k - self.n_sparse for tok, k in self.token_ids.items() if k >= self.n_sparse}
        self.sparse_ids = {tok: k for tok, k in self.token_ids.items() if k < self.n_sparse}
        self._tw: dict[float, np.ndarray] = {}
        self._plans: dict[tuple, list] = {}

    def _threshold_weight(self, threshold: float) -> np.ndarray:
        """``threshold * W(e)``, a hair lower so that rounding never drops an entry before the exact test."""
        tw = self._tw.get(threshold)
        if tw is None:
            if len(self._tw) >= TW_MAX:
                del self._tw[next(iter(self._tw))]  # the oldest threshold out
            tw = self._tw[threshold] = threshold * self.weight * (1.0 - 1e-12)
        return tw

    def _plan(self, tokens: tuple[str, ...], task_type: str) -> list[tuple]:
        """A query's work, memoised per (token tuple, task type) (``PLAN_MAX``, oldest out): per segment of
        rows it scores (all of them for ``""``; else the untyped rows and the task type's), its postings
        tokens' slices there in token-id order, their idf, lengths and total length, and the dense rows of the
        tokens present there."""
        key = (tokens, task_type)
        plan = self._plans.get(key)
        if plan is None:
            segs = self._segs.get(task_type)
            plan, ns = [], self.n_sparse
            for lo, hi, g in self._segs[None] if segs is None else segs:  # (an unknown task type: untyped rows)
                got = sorted({k for k in map(self.pieces[g].get, tokens) if k is not None})  # token-id order
                if not got:
                    continue
                cut = bisect_left(got, self.first_dense[g])
                k = np.array(got[:cut], dtype=np.int64)
                lens, views, tids = self.lens[g][k], self.views[g], self.tids[g]
                plan.append((lo, hi, [views[i] for i in got[:cut]], self.piece_idf[g][k], lens, int(lens.sum()),
                             [tids[i] - ns for i in got[cut:]]))
            if len(self._plans) >= PLAN_MAX:
                del self._plans[next(iter(self._plans))]
            self._plans[key] = plan
        return plan

    def above(self, tokens, threshold: float, task_type: str = "") -> tuple[np.ndarray, np.ndarray]:
        """(rows, sims) of every entry (of the task type, or untyped, when one is given) with
        ``sim > threshold`` for a query with these content tokens."""
        plan = self._plan(tokens if isinstance(tokens, tuple) else tuple(tokens), task_type)
        got = [self._score(threshold, *seg) for seg in plan]
        if len(got) == 1:
            return got[0]
        if not got:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        return np.concatenate([c for c, _ in got]), np.concatenate([s for _, s in got])

    def _score(self, threshold: float, lo: int, hi: int, posts: list, idf: np.ndarray, lens: np.ndarray,
               size: int, drows: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(rows, sims) above the threshold among rows lo:hi, from the postings slices and dense rows there."""
        n = hi - lo
        if size:
            rows = np.concatenate(posts) if len(posts) > 1 else posts[0]
            if lo:
                rows = rows - lo
            w = np.repeat(idf, lens)
        if drows or size * 64 > n:  # frequent tokens or long postings: one dense pass over the rows
            if size:
                dense = np.bincount(rows, weights=w, minlength=n)
                k0 = 0
            else:
                dense = self.dense[drows[0], lo:hi].copy()
                k0 = 1
            for k in drows[k0:]:  # a frequent token: one row added (an entry without it gets an exact +0.0)
                np.add(dense, self.dense[k, lo:hi], out=dense)
            cand = np.flatnonzero(dense > self._threshold_weight(threshold)[lo:hi])
            hit = dense[cand]
        else:  # short ones: only the entries they name
            cand = np.unique(rows)
            hit = np.bincount(np.searchsorted(cand, rows), weights=w, minlength=cand.size)
        if lo:
            cand += lo
        sim = hit / self.weight[cand]  # every candidate holds a query token, whose idf is > 0: W(e) > 0
        keep = sim > threshold
        return cand[keep], sim[keep]


def best_per_zone(cand: np.ndarray, sim: np.ndarray, zone: np.ndarray, per_zone: dict[str, int]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The candidates that can be among their zone's best k by similarity: every one at or above the zone's
    k-th largest similarity (ties kept, for the score and id tie-break)."""
    z = zone[cand]
    keep = np.zeros(cand.size, dtype=bool)
    for name, code in ZONE_CODES.items():
        k = per_zone.get(name, 0)
        if k <= 0:
            continue
        mine = z == code
        s = sim[mine]
        if s.size > k:
            mine &= sim >= (s.max() if k == 1 else np.partition(s, s.size - k)[s.size - k])
        keep |= mine
    return cand[keep], sim[keep]
