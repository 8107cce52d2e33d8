"""Exact difflib ratio, faster: the string-matching kernel of observation clustering (slea/experience/clustering.py).

:func:`fast_ratio` implements difflib's own matching-block algorithm (same junk/popular heuristic, same
tie-breaking, so bit-identical results — tested against difflib) but finds the longest block with C-level
``str.find``/slice comparisons instead of difflib's per-character Python loop, caches the prototype side
(:class:`PreparedText`), and stops early once the match count provably cannot reach what is needed. Rigorous
bounds (:func:`lcs_length`, :func:`match_upper_bound`) let the index discard candidates before any exact work.
"""

from __future__ import annotations

import difflib
import re
from bisect import bisect_right
from collections import Counter
from heapq import heappop, heappush

__all__ = ["PreparedText", "difflib_ratio", "fast_ratio", "lcs_length", "match_upper_bound", "matching_count"]

def difflib_ratio(a: str, b: str) -> float:
    """The reference similarity: ``SequenceMatcher(None, a, b).ratio()`` (a = observation, b = prototype)."""
    return difflib.SequenceMatcher(None, a, b).ratio()


# ---------------------------------------------------------------------------------------------------------------
# Exact difflib ratio, faster
# ---------------------------------------------------------------------------------------------------------------
_Q = 6  # anchor q-gram length
_S = 6  # anchor stride: every common substring of length >= _S + _Q - 1 contains an anchor q-gram
_DP_LIMIT = 1200  # rectangles with na*nb at most this use difflib's plain dynamic programme
_LCS_MAX = 400  # prototypes up to this length get the LCS bound before the exact ratio
_RUNS = re.compile(r"[^\x00]+")  # runs of elements that may seed a match, once the others are masked to NUL


class PreparedText:
    """The ``b`` side of a SequenceMatcher, computed once: positions of each non-popular element.

    Mirrors ``SequenceMatcher.__chain_b`` with ``isjunk=None, autojunk=True``: for ``len(b) >= 200`` elements
    occurring more than ``len(b)//100 + 1`` times are "popular" and cannot start a match.
    """

    __slots__ = ("_b2j", "_masks", "n", "popular", "s", "seeds")

    def __init__(self, b: str) -> None:
        n = len(b)
        self.s = b
        self.n = n
        self.popular = False
        self._b2j: dict[str, list[int]] | None = None
        self._masks: dict[str, int] | None = None
        if n >= 200:
            counts = Counter(b)
            ntest = n // 100 + 1
            seeds = {c for c, k in counts.items() if k <= ntest}
            self.popular = len(seeds) < len(counts)
            self.seeds = seeds  # the elements that may start a match (b2j's keys)
        else:
            self.seeds = self.b2j.keys()

    @property
    def b2j(self) -> dict[str, list[int]]:
        """Positions of each non-popular element (difflib's b2j), built on first use."""
        if self._b2j is None:
            b2j: dict[str, list[int]] = {}
            seeds = self.seeds if self.n >= 200 else None
            for i, c in enumerate(self.s):
                if seeds is None or c in seeds:
                    lst = b2j.get(c)
                    if lst is None:
                        b2j[c] = [i]
                    else:
                        lst.append(i)
            self._b2j = b2j
        return self._b2j

    def masks(self) -> dict[str, int]:
        """Bit mask of the positions of each character in b (for the bit-parallel LCS bound)."""
        if self._masks is None:
            m: dict[str, int] = {}
            for j, c in enumerate(self.s):
                m[c] = m.get(c, 0) | (1 << j)
            self._masks = m
        return self._masks


def _ext_right(a: str, b: str, i: int, j: int, amax: int, bmax: int) -> int:
    """Largest t with a[i:i+t] == b[j:j+t], i+t <= amax, j+t <= bmax (binary search over C slice compares)."""
    hi = min(amax - i, bmax - j)
    if hi <= 0 or a[i] != b[j]:
        return 0
    if a[i:i + hi] == b[j:j + hi]:
        return hi
    lo = 1
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if a[i:i + mid] == b[j:j + mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _ext_left(a: str, b: str, i: int, j: int, amin: int, bmin: int) -> int:
    """Largest t with a[i-t:i] == b[j-t:j], i-t >= amin, j-t >= bmin."""
    hi = min(i - amin, j - bmin)
    if hi <= 0 or a[i - 1] != b[j - 1]:
        return 0
    if a[i - hi:i] == b[j - hi:j]:
        return hi
    lo = 1
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if a[i - mid:i] == b[j - mid:j]:
            lo = mid
        else:
            hi = mid
    return lo


def _anchor_longest(a: str, b: str, alo: int, ahi: int, blo: int, bhi: int) -> tuple[int, int, int] | None:
    """Longest common substring of a[alo:ahi], b[blo:bhi] (ties: smallest i, then j), when it is long.

    Every common substring of length >= _S+_Q-1 contains one of the q-grams a[p:p+_Q], p = alo + k·_S; each
    occurrence of such a q-gram in b is extended to its maximal diagonal run. If the longest run found reaches
    _S+_Q-1, all runs of that length were found and the answer (with difflib's tie-break) is exact; otherwise
    None (the caller falls back to the dynamic programme).
    """
    runs: dict[int, list[tuple[int, int]]] = {}
    bk = 0
    bi = alo
    bj = blo
    find = b.find
    for p in range(alo, ahi - _Q + 1, _S):
        g = a[p:p + _Q]
        j = find(g, blo, bhi)
        while j >= 0:
            d = j - p
            lst = runs.get(d)
            covered = False
            if lst is not None:
                for x0, x1 in lst:
                    if x0 <= p < x1:
                        covered = True
                        break
            if not covered:
                left = _ext_left(a, b, p, j, alo, blo)
                k = left + _ext_right(a, b, p, j, ahi, bhi)
                i0 = p - left
                if lst is None:
                    runs[d] = [(i0, i0 + k)]
                else:
                    lst.append((i0, i0 + k))
                if k > bk or (k == bk and (i0 < bi or (i0 == bi and i0 + d < bj))):
                    bk, bi, bj = k, i0, i0 + d
            j = find(g, j + 1, bhi)
    if bk >= _S + _Q - 1:
        return bi, bj, bk
    return None


def _dp_longest(a: str, b2j: dict[str, list[int]], alo: int, ahi: int, blo: int, bhi: int) -> tuple[int, int, int]:
    """difflib's find_longest_match main loop (before junk extension)."""
    besti, bestj, bestsize = alo, blo, 0
    j2len: dict[int, int] = {}
    get = b2j.get
    for i in range(alo, ahi):
        js = get(a[i])
        if js is None:
            if j2len:
                j2len = {}
            continue
        j2lenget = j2len.get
        newj2len: dict[int, int] = {}
        for j in js:
            if j < blo:
                continue
            if j >= bhi:
                break
            k = newj2len[j] = j2lenget(j - 1, 0) + 1
            if k > bestsize:
                besti, bestj, bestsize = i - k + 1, j - k + 1, k
        j2len = newj2len
    return besti, bestj, bestsize


def _seed_longest(a: str, b: str, runs: list[tuple[int, int]], starts: list[int], alo: int, ahi: int, blo: int,
                  bhi: int) -> tuple[int, int, int]:
    """The popular case of difflib's main loop, by C-level search instead of dynamic programming.

    A seed is a run of equal non-popular elements; difflib keeps the longest, then the one starting first in a,
    then in b. ``runs`` are the maximal runs of a made of b's non-popular elements (found once per pair); any
    occurrence in b of a substring of such a run is itself made of non-popular elements, so ``b.find`` within
    the rectangle, longest substrings first, a-positions in order, yields exactly difflib's choice.
    """
    k = bisect_right(starts, alo) - 1
    k = max(k, 0)
    segs = []
    top = 0
    nruns = len(runs)
    while k < nruns:
        st, en = runs[k]
        if st >= ahi:
            break
        if en > alo:
            cs = max(alo, st)
            ce = min(ahi, en)
            segs.append((cs, ce))
            top = max(top, ce - cs)
        k += 1
    find = b.find

    def first(size: int) -> tuple[int, int] | None:  # the first a-position with a seed of this size
        for cs, ce in segs:
            for off in range(cs, ce - size + 1):
                j = find(a[off:off + size], blo, bhi)
                if j >= 0:
                    return off, j
        return None

    # having a common run of length s implies one of every shorter length: binary search the longest
    lo, hi = 0, min(top, bhi - blo)
    best = None
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        hit = first(mid)
        if hit is not None:
            lo, best = mid, hit
        else:
            hi = mid - 1
    if best is None or lo == 0:
        return alo, blo, 0
    return best[0], best[1], lo


def _longest(a: str, p: PreparedText, alo: int, ahi: int, blo: int, bhi: int,
             runs: tuple[list[tuple[int, int]], list[int]] | None = None) -> tuple[int, int, int]:
    """``SequenceMatcher(None, a, p.s).find_longest_match(alo, ahi, blo, bhi)``, exactly.

    ``runs`` (popular case only): a's maximal runs of non-popular elements and their starts.
    """
    b = p.s
    if p.popular:
        i, j, k = _seed_longest(a, b, runs[0], runs[1], alo, ahi, blo, bhi)
    else:
        if (ahi - alo) * (bhi - blo) > _DP_LIMIT and ahi - alo >= _S + _Q - 1:
            r = _anchor_longest(a, b, alo, ahi, blo, bhi)
            if r is not None:
                return r  # without popular elements the longest block is already maximal
        i, j, k = _dp_longest(a, p.b2j, alo, ahi, blo, bhi)
    # difflib then extends the block with equal elements on both sides (with isjunk=None, bjunk is empty, so
    # popular elements extend too); with no block at all it still extends from (alo, blo).
    if k:
        t = _ext_left(a, b, i, j, alo, blo)
        i -= t
        j -= t
        k += t
        k += _ext_right(a, b, i + k, j + k, ahi, bhi)
    else:
        k = _ext_right(a, b, alo, blo, ahi, bhi)
    return i, j, k


class _Match:
    """difflib's matching-block recursion for (a, b), run one rectangle at a time, largest rectangle first.

    The total is order-independent; largest-first makes the bounds converge fastest. At any point
    ``total <= final <= total + pot`` (pot: what the pending rectangles could still add, at most the shorter
    side of each), optionally capped by a precomputed bound (the LCS). The search races candidates on these
    bounds and stops refining as soon as the winner is certain.
    """

    __slots__ = ("a", "cap", "heap", "p", "pot", "runs", "total")

    def __init__(self, a: str, p: PreparedText, cap: int | None = None) -> None:
        la, lb = len(a), p.n
        self.a = a
        self.p = p
        self.runs = None  # popular case: a's runs of non-popular elements, found at the first step
        n = min(lb, la)
        self.heap = [(-n, 0, la, 0, lb)] if n else []
        self.total = 0
        self.pot = n
        self.cap = cap

    def ub(self) -> int:
        u = self.total + self.pot
        return u if self.cap is None or u < self.cap else self.cap

    def step(self) -> None:
        if self.runs is None and self.p.popular:
            seeds = self.p.seeds
            masked = self.a.translate({ord(c): 0 for c in set(self.a) if c not in seeds})
            spans = [m.span() for m in _RUNS.finditer(masked)]
            self.runs = (spans, [x for x, _ in spans])
        neg, alo, ahi, blo, bhi = heappop(self.heap)
        self.pot += neg
        i, j, k = _longest(self.a, self.p, alo, ahi, blo, bhi, self.runs)
        if k:
            self.total += k
            if alo < i and blo < j:
                x, y = i - alo, j - blo
                m = min(y, x)
                heappush(self.heap, (-m, alo, i, blo, j))
                self.pot += m
            if i + k < ahi and j + k < bhi:
                x, y = ahi - i - k, bhi - j - k
                m = min(y, x)
                heappush(self.heap, (-m, i + k, ahi, j + k, bhi))
                self.pot += m


def matching_count(a: str, p: PreparedText, floor: int = 0, stop: int | None = None) -> int:
    """Total size of ``SequenceMatcher(None, a, p.s).get_matching_blocks()``; -1 once it is proven < ``floor``.

    With ``stop``, returns a partial total (a lower bound) as soon as it reaches ``stop``.
    """
    m = _Match(a, p)
    while m.heap:
        m.step()
        if m.total + m.pot < floor:
            return -1
        if stop is not None and m.total >= stop:
            return m.total
    return m.total


def lcs_length(a: str, p: PreparedText, max_middle: int | None = None) -> int | None:
    """Length of the longest common subsequence of a and b (Allison–Dix bit-parallel, big-int columns).

    difflib's matching blocks form a common subsequence, so this bounds its match count from above; it is
    tight where difflib is (texts without popular characters) and costs a few big-int operations per char of
    a's middle (after the common prefix and suffix); with ``max_middle``, returns None when that is longer.
    """
    b = p.s
    la, lb = len(a), p.n
    n = min(lb, la)
    pre = _common_prefix(a, b, n)  # a common prefix/suffix is always part of some LCS: strip them
    suf = _common_suffix(a, b, n - pre)
    if pre + suf >= n:
        return n
    if max_middle is not None and la - pre - suf > max_middle:
        return None  # too costly to be worth it
    mb = lb - pre - suf
    full = (1 << mb) - 1
    s = full
    get = p.masks().get
    for c in a[pre:la - suf]:
        m = get(c)
        if m:
            m = (m >> pre) & full
            if m:
                u = s & m
                s = (s + u) | (s - u)
    return pre + suf + mb - (s & full).bit_count()


def fast_ratio(a: str, b: str | PreparedText) -> float:
    """``SequenceMatcher(None, a, b).ratio()``, bit-identical, several times faster on similar texts."""
    p = b if isinstance(b, PreparedText) else PreparedText(b)
    t = len(a) + p.n
    return 2.0 * matching_count(a, p) / t if t else 1.0


def _need(threshold: float, total: int) -> int:
    """Smallest match count m with ``2.0*m/total >= threshold`` (the float expression difflib uses)."""
    if total == 0:
        return 0
    m = max(0, int(threshold * total / 2.0) - 1)
    while 2.0 * m / total < threshold:
        m += 1
    return m


def _need_above(ratio: float, total: int) -> int:
    """Smallest match count m with ``2.0*m/total > ratio``."""
    if total == 0:
        return 1
    m = max(0, int(ratio * total / 2.0) - 1)
    while 2.0 * m / total <= ratio:
        m += 1
    return m


def _common_prefix(a: str, b: str, n: int) -> int:
    if a[:n] == b[:n]:
        return n
    if not n or a[0] != b[0]:
        return 0
    lo, hi = 1, n
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _common_suffix(a: str, b: str, n: int) -> int:
    la, lb = len(a), len(b)
    if not n or a[la - 1] != b[lb - 1]:
        return 0
    if a[la - n:] == b[lb - n:]:
        return n
    lo, hi = 1, n
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if a[la - mid:] == b[lb - mid:]:
            lo = mid
        else:
            hi = mid
    return lo


def match_upper_bound(a: str, b: str, need: int = 0) -> int:
    """An upper bound on difflib's match count between a and b.

    difflib's matches form a common subsequence, so they never exceed LCS(a, b) = P + S + LCS(middles) (P, S:
    common prefix and suffix), which is at most P + S + the multiset intersection of the middles (difflib's
    ``quick_ratio`` applied to the middles only). The multiset part is skipped when the cheaper length part
    already falls below ``need``.
    """
    la, lb = len(a), len(b)
    n = min(lb, la)
    pre = _common_prefix(a, b, n)
    suf = _common_suffix(a, b, n - pre)
    fixed = pre + suf
    if fixed >= n or n < need:
        return n
    ma = a[pre:la - suf]
    mb = b[pre:lb - suf]
    inter = sum((Counter(ma) & Counter(mb)).values())
    return fixed + inter
