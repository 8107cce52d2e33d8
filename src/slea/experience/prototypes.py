"""The prototypes of one task type, sorted by length, with their byte histograms: step 2 of observation
clustering (slea/experience/clustering.py), a vectorised upper bound on difflib's match count that reads only the
prototypes whose length can reach δ."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import chain

import numpy as np

_SCAN_ALL = 12  # task types with at most this many prototypes skip the histogram step (numpy call overhead)
_GAP = 1024  # a query's window and the unsorted tail are bounded in two numpy passes when this far apart
_TAIL = 1024  # the unsorted tail is merged in past max(_TAIL, sorted/64) columns (smaller tables never sort)


def _bucket_table() -> bytes:
    """UTF-8 byte -> one of 64 buckets: letters case-folded, digits, the rest (punctuation, non-ASCII) hashed.

    Merging characters into a bucket keeps the bound an upper bound (a min of sums is at least the sum of mins),
    and a matched character brings the same bytes to both sides, so byte counts bound character matches too.
    """
    alpha = [ord(chr(i).lower()) - 97 if chr(i).isascii() and chr(i).isalpha() else -1 for i in range(256)]
    return bytes(a if a >= 0 else 26 + i - 48 if 48 <= i <= 57 else 36 + i % 28 for i, a in enumerate(alpha))


_BUCKET = _bucket_table()
_K = 64
_CAP = np.iinfo(np.uint16).max  # texts of more bytes get no histogram bound (a saturated row always passes)


def _histogram(raw: bytes) -> np.ndarray:
    """Bucketed byte counts (uint16) of a UTF-8 text of at most ``_CAP`` bytes, else all ``_CAP``."""
    if len(raw) > _CAP:
        return np.full(_K, _CAP, np.uint16)
    return np.bincount(np.frombuffer(raw.translate(_BUCKET), np.uint8), minlength=_K).astype(np.uint16)


class _Table:
    """One task type's prototypes: bucketed byte histograms (one column each), lengths, cluster ids and texts.

    A prototype can only qualify within a window of lengths (M <= min(la, lb), so 2·min(la, lb)/(la + lb) >= δ):
    columns ``[0, nsorted)`` are kept sorted by length and a query bounds its window's slice, plus the unsorted
    tail of recent additions; the tail is merged in once it outgrows ``max(_TAIL, nsorted/64)`` (an argsort,
    amortised over the additions; a table of fewer than _TAIL prototypes is all tail and never pays a merge). Evicted columns are marked dead and dropped at the next merge. Histograms
    are stored transposed (64 × columns): the bound then sums 64 contiguous vectors, not 64 counts per column.
    """

    __slots__ = ("cids", "dead", "hist", "lens", "n", "nsorted", "row", "texts", "weight")

    def __init__(self) -> None:
        self.n = self.nsorted = self.dead = 0
        self.hist = np.zeros((_K, 8), np.uint16)
        self.weight = np.zeros(8)  # (δ - slack)/2 · len(prototype); +inf once dead
        self.lens: list[int] = []
        self.cids: list[int] = []  # -1 once dead
        self.texts: list[str] = []
        self.row: dict[int, int] = {}  # cid -> column

    def __len__(self) -> int:
        return self.n - self.dead

    def add(self, cid: int, text: str, weight: float) -> None:
        n = self.n
        if n == len(self.weight):  # grow by doubling
            self.hist = np.concatenate([self.hist, np.zeros_like(self.hist)], axis=1)
            self.weight = np.concatenate([self.weight, np.zeros_like(self.weight)])
        self.hist[:, n] = _histogram(text.encode("utf-8", "surrogatepass"))
        self.weight[n] = weight
        self.lens.append(len(text))
        self.cids.append(cid)
        self.texts.append(text)
        self.row[cid] = n
        self.n = n + 1
        if self.n - self.nsorted > max(_TAIL, self.nsorted >> 6):
            self._merge()

    def remove(self, cid: int) -> None:
        r = self.row.pop(cid)
        self.weight[r] = np.inf  # never passes the bound
        self.cids[r] = -1
        self.dead += 1

    def _merge(self) -> None:
        """Sort every live column by length (stable: equal lengths keep their order)."""
        live = np.flatnonzero(self.weight[:self.n] != np.inf)
        order = live[np.argsort(np.array(self.lens)[live], kind="stable")]
        k = len(order)
        self.hist[:, :k] = self.hist[:, order]
        self.weight[:k] = self.weight[order]
        idx = order.tolist()
        self.lens = [self.lens[i] for i in idx]
        self.cids = [self.cids[i] for i in idx]
        self.texts = [self.texts[i] for i in idx]
        self.row = {c: r for r, c in enumerate(self.cids)}
        self.n = self.nsorted = k
        self.dead = 0

    def window(self, la: int, half: float) -> tuple[int, int]:
        """The sorted columns whose length can reach δ with a text of length ``la``: ``2·min >= 2·half·(la + lb)``
        gives ``la·half/(1 - half) <= lb <= la·(1 - half)/half`` (widened by one for float rounding)."""
        lo = int(la * half / (1.0 - half))
        hi = int(la * (1.0 - half) / half) + 1
        return bisect_left(self.lens, lo, 0, self.nsorted), bisect_right(self.lens, hi, 0, self.nsorted)

    def bounded(self, text: str, half: float) -> tuple[list[int], list[float] | None]:
        """Live columns whose histogram bound reaches δ: ``Σ min(h_a, h_b) >= (δ - slack)/2 · (la + lb)``.

        Returns them best bound first, with each one's ratio bound ``2·min(Σ, la, lb)/(la + lb)`` (never below
        the exact ratio), or in column order and None where the table is too small for the histogram step.
        """
        la, n, ns = len(text), self.n, self.nsorted
        lo, hi = self.window(la, half)
        raw = text.encode("utf-8", "surrogatepass")
        if hi - lo + n - ns <= _SCAN_ALL or len(raw) > _CAP:
            cids = self.cids
            return [r for r in chain(range(lo, hi), range(ns, n)) if cids[r] >= 0], None
        h = _histogram(raw)[:, None]
        need = half * la
        lens = self.lens
        found = []
        # columns between the window and the tail would fail the bound anyway (it implies the window, but for
        # multi-byte characters): one numpy pass over [lo, n) unless that gap is wide. The sums cannot overflow
        # uint16: Σ min(h_a, h_b) <= Σ h_a, the query's bytes (at most _CAP here).
        for a, b in ((lo, n),) if ns - hi < _GAP else ((lo, hi), (ns, n)):
            if b > a:
                s = np.minimum(self.hist[:, a:b], h).sum(0, dtype=np.uint16)
                ok = np.flatnonzero(s >= self.weight[a:b] + need)
                found += [(2.0 * min(v, lens[r], la) / (la + lens[r]), r)
                          for r, v in zip((ok + a).tolist(), s[ok].tolist())]
        found.sort(reverse=True)  # the order only saves work: any order gives the same answer
        return [r for _, r in found], [u for u, _ in found]
