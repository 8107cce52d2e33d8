"""Exact difflib ratio, faster: the string-matching kernel of observation clustering (slea/experience/clustering.py).

difflib's ratio is ``2·M / (len(a) + len(b))``, M the total size of the matching blocks that
``SequenceMatcher(None, a, b)`` finds by recursion: the longest block of the rectangle (its core made of b's
non-"popular" elements, autojunk, then extended by equal elements on both sides; ties: first in a, then in b),
then the same left and right of it. :class:`_Match` runs that recursion one rectangle at a time so that
clustering can stop as soon as a decision is certain; each rectangle's longest block comes from the compiled
``cydifflib`` (a Cython port of difflib, bit-identical: tests/experience/test_textmatch.py), whose search costs
O(rectangle area). Large rectangles of texts with popular elements instead search their cores with C-level
``str.find`` over a's runs of non-popular elements (:func:`_seed_longest`), which costs far less than the area.
"""

from __future__ import annotations

import difflib
import re
from bisect import bisect_right
from heapq import heappop, heappush

from cydifflib import SequenceMatcher as _CompiledMatcher

__all__ = ["PreparedText", "difflib_ratio", "fast_ratio", "matching_count"]

_SEED_FROM = 20_000  # popular rectangles of more cells than this use the str.find seed search, not cydifflib
_RUNS = re.compile(r"[^\x00]+")  # runs of elements that may seed a match, once the others are masked to NUL


def difflib_ratio(a: str, b: str) -> float:
    """The reference similarity: ``SequenceMatcher(None, a, b).ratio()`` (a = observation, b = prototype)."""
    return difflib.SequenceMatcher(None, a, b).ratio()


class PreparedText:
    """The ``b`` side of a SequenceMatcher, computed once: a compiled matcher holding b's element positions.

    ``popular``: b has 200+ elements and some occur more than ``len(b)//100 + 1`` times (difflib's autojunk);
    those may extend a block but never start one. The matcher's first sequence is set per comparison, so one
    PreparedText serves one comparison at a time (the index that caches them is not thread-safe either).
    """

    __slots__ = ("matcher", "n", "popular", "s")

    def __init__(self, b: str) -> None:
        self.s = b
        self.n = len(b)
        self.matcher = _CompiledMatcher(None, "", b)
        self.popular = bool(self.matcher.bpopular)

    def seeds(self) -> dict[str, list[int]]:
        """The elements that may start a block (difflib's b2j: b's non-popular elements -> positions)."""
        return self.matcher.b2j


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


def _seed_runs(a: str, p: PreparedText) -> tuple[list[tuple[int, int]], list[int]]:
    """a's maximal runs of b's non-popular elements (spans) and their starts: where a block's core can lie."""
    seeds = p.seeds()
    masked = a.translate({ord(c): 0 for c in set(a) if c not in seeds})
    spans = [m.span() for m in _RUNS.finditer(masked)]
    return spans, [x for x, _ in spans]


def _seed_longest(a: str, b: str, runs: list[tuple[int, int]], starts: list[int], alo: int, ahi: int, blo: int,
                  bhi: int) -> tuple[int, int, int]:
    """The core of difflib's longest block (before extension), by C-level search instead of dynamic programming.

    A core is a run of equal non-popular elements; difflib keeps the longest, then the one starting first in a,
    then in b. ``runs`` are the maximal runs of a made of b's non-popular elements (found once per pair); any
    occurrence in b of a substring of such a run is itself made of non-popular elements, so ``b.find`` within
    the rectangle, longest substrings first, a-positions in order, yields exactly difflib's choice.
    """
    k = max(bisect_right(starts, alo) - 1, 0)
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

    def first(size: int) -> tuple[int, int] | None:  # the first a-position with a core of this size
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
        self.runs: tuple[list[tuple[int, int]], list[int]] | None = None  # popular case, found when first needed
        n = min(lb, la)
        self.heap = [(-n, 0, la, 0, lb)] if n else []
        self.total = 0
        self.pot = n
        self.cap = cap

    def ub(self) -> int:
        u = self.total + self.pot
        return u if self.cap is None or u < self.cap else self.cap

    def longest(self, alo: int, ahi: int, blo: int, bhi: int) -> tuple[int, int, int]:
        """``SequenceMatcher(None, a, b).find_longest_match(alo, ahi, blo, bhi)``, exactly."""
        a, p = self.a, self.p
        if not p.popular or (ahi - alo) * (bhi - blo) <= _SEED_FROM:
            p.matcher.set_seq1(a)  # a no-op when a is already set
            return p.matcher.find_longest_match(alo, ahi, blo, bhi)
        if self.runs is None:
            self.runs = _seed_runs(a, p)
        b = p.s
        i, j, k = _seed_longest(a, b, *self.runs, alo, ahi, blo, bhi)
        # difflib then extends the core with equal elements on both sides (with isjunk=None nothing is junk, so
        # popular elements extend too); with no core at all it still extends from (alo, blo).
        if not k:
            return i, j, _ext_right(a, b, alo, blo, ahi, bhi)
        t = _ext_left(a, b, i, j, alo, blo)
        i, j, k = i - t, j - t, k + t
        return i, j, k + _ext_right(a, b, i + k, j + k, ahi, bhi)

    def step(self) -> None:
        neg, alo, ahi, blo, bhi = heappop(self.heap)
        self.pot += neg
        i, j, k = self.longest(alo, ahi, blo, bhi)
        if k:
            self.total += k
            if alo < i and blo < j:
                m = min(j - blo, i - alo)
                heappush(self.heap, (-m, alo, i, blo, j))
                self.pot += m
            if i + k < ahi and j + k < bhi:
                m = min(bhi - j - k, ahi - i - k)
                heappush(self.heap, (-m, i + k, ahi, j + k, bhi))
                self.pot += m


def matching_count(a: str, p: PreparedText) -> int:
    """Total size of ``SequenceMatcher(None, a, p.s).get_matching_blocks()``."""
    m = _Match(a, p)
    while m.heap:
        m.step()
    return m.total


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
