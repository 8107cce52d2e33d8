"""Eq.2's similarity, exact over the whole library and fast (SLEA-RL Eq.2; sim defined in retrieval.py).

Two similarities (``experience.fallback_similarity``): ``tokens`` (the default, below: :class:`TokenMatrix`) and
``sequence``, Eq.2 as printed (:func:`eq2_sequence`, at the end: the clustering's difflib ratio, sim > δ).

``sim(q, e) = hit(q, e) / W(e)``: ``hit`` is the idf of the entry's content tokens that occur in the query,
``W(e)`` the idf of all of them, with ``idf = log(1 + n / (1 + df))`` over the library's n entries.

:class:`TokenMatrix` holds the library's tokens as one array of postings (the entry rows of each token, sorted,
token after token), built once per library content version. Rows are grouped by task type (untyped first), so
a typed query scores only the untyped rows and its task type's: ``cut[t, g]`` is where group g starts in token
t's posting. A query adds each of its tokens' idf to the rows of its posting there, in token-id order, then
keeps the rows with ``hit / W > threshold``; with ``per_zone`` only those that can be among their zone's best k.
Every entry is scored: there is no candidate filter.

The most frequent tokens (in at least 1/8 of the entries, at most 64 of them, 64 MiB) also have a dense row
``idf * [token in entry]``: in a group where the token is in at least 1/8 of the rows, adding the row over the
group costs less than scattering the posting. The row adds ``+0.0`` to the rows without the token, so the sums
are the same floats either way.

Two implementations of the same sums: a compiled kernel (numba, from the ``experience`` extra; one call per
query, scatter, threshold and per-zone pruning included) and, without numba, numpy (one weighted ``bincount``
per group over the query tokens' posting slices). Both add every entry's idf terms in token-id order (the dense
tokens last), as ``W(e)`` is summed, so the scores are identical, bit for bit, whichever runs, and do not depend
on the query's token order or on string hashing; tests/experience/test_eq2.py checks both against a plain scan.

Profiled 2026-12-03 (bench/retrieval.py's 10k library, 723 tokens, queries of ~60 tokens and 6-10k posting
ids): the numpy form spent about as much building each query's plan (slices, idf, lengths) and pruning per zone
(a dozen numpy calls on small arrays) as scoring; the kernel does all three in one call (the A/B:
bench/results/retrieval_eq2_ab/kernel_*.json; at 100k it is no faster than numpy). Tried before (2026-12-01/02): ``np.add.at``, torch ``index_add_``, scipy CSR products (no cheaper than
``bincount``); a dense matrix of the frequent tokens with their entries as extra candidates (83 % of the
library were candidates, 5x slower).

Exactness: an entry matched by one query token gets that token's idf exactly, so ties at the threshold (two
tokens of the same df, one of them in the query: sim = 0.5) fall as in the plain scan. The threshold is
``>= 0``: entries without a query token (sim 0) are never returned.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np

from slea.experience.library import ExperienceLibrary
from slea.experience.textmatch import fast_ratio

ZONE_CODES = {"pos": 0, "neg": 1}
DENSE_SHARE = 8  # a token in at least 1/8 of the rows (library, then group) is added as a dense row
DENSE_MAX_ROWS = 64
DENSE_MAX_BYTES = 64 << 20
SPARSE_SHARE = 16  # postings under 1/16 of a group's rows: only the rows they touch are scanned
PREFILTER = 1.0 - 1e-12  # hit > threshold * W(e) * PREFILTER before the exact division (never drops an entry)


def _kernel(cut, rows, idf, dense, dense_of, tids, segs, weight, threshold, zone, kz, acc, touched,
            out_rows, out_sim):  # pragma: no cover - compiled by numba (its tests run it)
    """Eq.2 for one query: scores, threshold and per-zone pruning in one pass per segment of rows.

    ``segs[s] = (lo, hi, a, b)``: rows lo:hi, whose slice of posting t is ``rows[cut[t, a]:cut[t, b]]``.
    ``acc`` (zero on entry and on return) accumulates each row's hit in token-id order (``tids`` sorted);
    a dense token frequent in the segment adds its row instead of scattering. Candidates (sim > threshold) go
    to out_rows / out_sim; ``kz[z]`` (-1: keep all) then keeps zone z's best k and the ties at its k-th.
    Returns how many are kept."""
    k = 0
    c = threshold * PREFILTER
    for s in range(segs.shape[0]):
        lo, hi, a, b = segs[s, 0], segs[s, 1], segs[s, 2], segs[s, 3]
        n = hi - lo
        total = 0
        full = False
        for t in tids:
            m = cut[t, b] - cut[t, a]
            if dense_of[t] >= 0 and m > 0 and m * DENSE_SHARE >= n:
                full = True
            else:
                total += m
        full = full or total * SPARSE_SHARE >= n
        nt = 0
        for t in tids:
            i, j = cut[t, a], cut[t, b]
            if i == j:
                continue
            d = dense_of[t]
            if d >= 0 and (j - i) * DENSE_SHARE >= n:
                for r in range(lo, hi):
                    acc[r] += dense[d, r]
            else:
                w = idf[t]
                for p in range(i, j):
                    r = rows[p]
                    if not full and acc[r] == 0.0:
                        touched[nt] = r
                        nt += 1
                    acc[r] += w
        for q in range(n if full else nt):
            r = lo + q if full else touched[q]
            h = acc[r]
            if h == 0.0:
                continue
            acc[r] = 0.0
            if h > c * weight[r]:
                v = h / weight[r]
                if v > threshold:
                    out_rows[k] = r
                    out_sim[k] = v
                    k += 1
    for z in range(2):  # per zone: its kk-th largest similarity, then only what is at or above it
        kk = kz[z]
        if kk <= 0:
            continue
        top = np.full(kk, -1.0)  # the zone's kk largest, descending (-1: none yet; every sim is > 0)
        for q in range(k):
            v = out_sim[q]
            if zone[out_rows[q]] == z and v > top[kk - 1]:
                p = kk - 1
                while p > 0 and top[p - 1] < v:
                    top[p] = top[p - 1]
                    p -= 1
                top[p] = v
        kth = top[kk - 1]
        if kth < 0.0:  # at most kk in the zone: all kept
            continue
        kept = 0
        for q in range(k):
            if zone[out_rows[q]] != z or out_sim[q] >= kth:
                out_rows[kept] = out_rows[q]
                out_sim[kept] = out_sim[q]
                kept += 1
        k = kept
    kept = 0
    for q in range(k):  # a zone with k == 0 keeps nothing (-1: no pruning)
        if kz[zone[out_rows[q]]] != 0:
            out_rows[kept] = out_rows[q]
            out_sim[kept] = out_sim[q]
            kept += 1
    return kept


_KERNEL = None  # _kernel compiled, on first use (numba's import and set-up take ~1 s); False: no numba


def _compiled():
    """The compiled kernel, or False where numba is not installed (then :meth:`TokenMatrix.above` runs numpy).
    Loaded on the first Eq.2 query, not on import, so that a process that never needs Eq.2 never pays for it."""
    global _KERNEL
    if _KERNEL is None:
        try:
            import numba
        except ImportError:  # pragma: no cover - the experience extra brings numba
            _KERNEL = False
        else:
            _KERNEL = numba.njit(cache=True)(_kernel)
    return _KERNEL


class TokenMatrix:
    """Entries x content tokens of one library content version (immutable).

    ``dense_share``: tokens in at least ``n / dense_share`` entries (at most ``DENSE_MAX_ROWS`` of them, the most
    frequent, within ``DENSE_MAX_BYTES``) also get a dense float64 row ``idf * [token in entry]``; ``0``: none.

    Rows are grouped by task type (the untyped entries first, then each task type's, ``starts``); ``rows``
    holds every token's posting (sorted rows), token after token, and ``cut[t, g]`` where group g starts in
    token t's (``cut[t, -1]``: where it ends). Token ids (``token_ids``) fix the order of every sum: the tokens
    without a dense row in string order, then the dense ones in row order."""

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
        task = np.array([codes[e.task_type] if e.task_type else -1 for e in entries], dtype=np.int64)
        # group g (0: untyped, 1 + code: a task type) holds rows starts[g]:starts[g + 1]
        self.starts = np.searchsorted(task, np.arange(-1, len(codes) + 1))
        self.zone = np.array([ZONE_CODES[e.zone] for e in entries], dtype=np.int8)
        items = sorted((tok, len(ids), ids) for tok, ids in lib.posting_items())
        cap = min(DENSE_MAX_ROWS, DENSE_MAX_BYTES // (8 * max(n, 1))) if dense_share > 0 else 0
        by_df = sorted(range(len(items)), key=lambda i: (-items[i][1], items[i][0]))[:cap]
        freq = [i for i in by_df if items[i][1] * dense_share >= n]
        dense_of = set(freq)
        order = [i for i in range(len(items)) if i not in dense_of] + freq
        self.token_ids = {items[i][0]: k for k, i in enumerate(order)}
        self.df = np.array([items[i][1] for i in order], dtype=np.int64)
        self.idf = np.log1p(n / (1.0 + self.df))
        lut = np.zeros(int(self.eids.max()) + 1 if n else 0, dtype=np.int64)  # entry id -> row
        lut[self.eids] = np.arange(n)
        postings = [np.sort(lut[np.fromiter(items[i][2], dtype=np.int64, count=items[i][1])]) for i in order]
        self.rows = np.concatenate(postings) if postings else np.zeros(0, dtype=np.int64)
        off = np.cumsum(self.df) - self.df
        self.cut = (off[:, None] + np.array([np.searchsorted(p, self.starts) for p in postings], dtype=np.int64
                                            ).reshape(len(order), self.starts.size))
        self.weight = np.bincount(self.rows, weights=np.repeat(self.idf, self.df), minlength=n)
        n_sparse = len(order) - len(freq)
        self.dense_of = np.full(len(order), -1, dtype=np.int64)  # token id -> its dense row, or -1
        self.dense_of[n_sparse:] = np.arange(len(freq))
        self.dense = np.zeros((len(freq), n))
        for k, p in enumerate(postings[n_sparse:]):
            self.dense[k, p] = self.idf[n_sparse + k]
        self.dense_ids = {tok: k - n_sparse for tok, k in self.token_ids.items() if k >= n_sparse}
        # the kernel's sums (zero between calls) and touched rows: shared, safe since the kernel holds the GIL
        self._acc = np.zeros(n)
        self._touched = np.zeros(n, dtype=np.int64)
        self._segs = self._segments(entries)

    def _segments(self, entries) -> dict:
        """Per task type, the segments a query scores, ``(lo, hi, a, b)``: rows lo:hi, the slice of posting t
        there ``cut[t, a]:cut[t, b]``. ``""``: every row; ``None`` (and an unknown task type): the untyped
        rows; a task type: the untyped rows and its own."""
        st = self.starts.tolist()
        last = len(st) - 1
        untyped = [(st[0], st[1], 0, 1)] if st[1] > st[0] else []
        segs = {"": [(0, self.n, 0, last)], None: untyped}
        for code in range(last - 1):
            segs[entries[st[code + 1]].task_type] = untyped + [(st[code + 1], st[code + 2], code + 1, code + 2)]
        return {k: np.array(v, dtype=np.int64).reshape(len(v), 4) for k, v in segs.items()}

    def above(self, tokens, threshold: float, task_type: str = "", per_zone: dict[str, int] | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
        """(rows, sims) of every entry (of the task type, or untyped, when one is given) with
        ``sim > threshold`` (``>= 0``) for a query with these content tokens (unknown ones are ignored).
        ``per_zone`` ({"pos": k+, "neg": k−}): only those that can be among their zone's best k (ties at the
        k-th similarity kept; a zone not named keeps nothing). Rows in no particular order."""
        ids = self.token_ids
        tids = np.array(sorted({ids[t] for t in tokens if t in ids}), dtype=np.int64)
        segs = self._segs.get(task_type, self._segs[None])
        kernel = _compiled()
        if not kernel:
            rows, sims = self._above_numpy(tids, float(threshold), segs)
            return (rows, sims) if per_zone is None else best_per_zone(rows, sims, self.zone, per_zone)
        kz = np.array([-1, -1] if per_zone is None else [max(int(per_zone.get(z, 0)), 0) for z in ZONE_CODES],
                      dtype=np.int64)
        out_rows, out_sim = np.empty(self.n, dtype=np.int64), np.empty(self.n)
        k = kernel(self.cut, self.rows, self.idf, self.dense, self.dense_of, tids, segs, self.weight,
                    float(threshold), self.zone, kz, self._acc, self._touched, out_rows, out_sim)
        return out_rows[:k], out_sim[:k]

    def _above_numpy(self, tids: np.ndarray, threshold: float, segs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`above` without numba, the same floats: per segment, one weighted ``bincount`` over the
        postings slices of the tokens without a dense row (in token-id order), then the dense rows of those
        with one, in token-id order (they come last)."""
        got = []
        for lo, hi, a, b in segs.tolist():
            i, j = self.cut[tids, a], self.cut[tids, b]
            present = j > i
            d = self.dense_of[tids[present]]
            drows = d[d >= 0].tolist()
            sp = present & (self.dense_of[tids] < 0)
            posts = [self.rows[x:y] for x, y in zip(i[sp].tolist(), j[sp].tolist())]
            rows = np.concatenate(posts) if posts else np.zeros(0, dtype=np.int64)
            w = np.repeat(self.idf[tids[sp]], (j - i)[sp])
            n = hi - lo
            if drows or rows.size * SPARSE_SHARE >= n:  # one dense pass over the rows
                hit = np.bincount(rows - lo, weights=w, minlength=n) if rows.size else np.zeros(n)
                for k in drows:  # a dense row: +0.0 to the rows without the token
                    np.add(hit, self.dense[k, lo:hi], out=hit)
                cand = np.flatnonzero(hit)
                hit = hit[cand]
                cand += lo
            else:  # short postings: only the rows they name
                cand = np.unique(rows)
                hit = np.bincount(np.searchsorted(cand, rows), weights=w, minlength=cand.size)
            sim = hit / self.weight[cand]
            keep = sim > threshold
            got.append((cand[keep], sim[keep]))
        if len(got) == 1:
            return got[0]
        if not got:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        return np.concatenate([c for c, _ in got]), np.concatenate([s for _, s in got])


def best_per_zone(cand: np.ndarray, sim: np.ndarray, zone: np.ndarray, per_zone: dict[str, int]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The candidates that can be among their zone's best k by similarity: every one at or above the zone's
    k-th largest similarity (ties kept, for the score and id tie-break); a zone with k <= 0 keeps nothing."""
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


# -- Eq.2 as printed: the clustering's sequence similarity ---------------------------------------------------------
def _histogram_bound(a: Counter, b: str) -> int:
    """An upper bound of difflib's match count M of ``a`` (its character counts) and ``b``: Σ_c min(count_a(c),
    count_b(c)) (difflib's ``quick_ratio``; M <= LCS <= this)."""
    return sum(min(n, a.get(c, 0)) for c, n in Counter(b).items())


def eq2_sequence(observation: str, entries: Iterable[tuple[int, str]], delta: float
                 ) -> list[tuple[float, int]]:
    """SLEA-RL (Wang & Jiang 2026) Eq.2 as printed: ``{e ∈ E : sim(o_t, e) > δ}``, as (sim, entry id), best
    first (ties: lower id first).

    ``sim`` is the sequence similarity the paper also clusters with (§3.3, δ = 0.85): difflib's
    ``SequenceMatcher(None, o_t, s_e).ratio()`` of the observation and the entry's text ``s_e``, computed
    bit-identically by :func:`~slea.experience.textmatch.fast_ratio`. The inequality is strict: an entry at
    exactly δ is not returned. ``entries``: (id, text) pairs (the caller scopes them, e.g. by task type).

    Exact: two upper bounds of the ratio only skip entries that cannot exceed δ — ``2·min(la, lb)/(la + lb)``
    (M <= the shorter length) and difflib's ``quick_ratio`` (character counts) — and they are the same float
    expression ``2.0 * m / (la + lb)`` with a larger m, so a skipped entry's ratio is <= its bound <= δ.
    """
    delta = float(delta)
    out: list[tuple[float, int]] = []
    la = len(observation)
    counts: Counter | None = None
    for eid, text in entries:
        total = la + len(text)
        if total == 0:
            sim = 1.0  # difflib: two empty sequences are identical
        else:
            if 2.0 * min(la, len(text)) / total <= delta:
                continue
            if counts is None:
                counts = Counter(observation)
            if 2.0 * _histogram_bound(counts, text) / total <= delta:
                continue
            sim = fast_ratio(observation, text)
        if sim > delta:
            out.append((sim, int(eid)))
    out.sort(key=lambda x: (-x[0], x[1]))
    return out
