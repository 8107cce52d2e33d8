"""Clustering references for tests and benchmarks: the plain scan with the index's semantics, and the Rand
index that measures how far two clusterings agree (tests/experience/test_clustering.py, bench/retrieval.py)."""

from __future__ import annotations

import difflib
import random
from collections import Counter
from typing import Any

from rapidfuzz.distance import LCSseq

from slea.experience.textmatch import PreparedText, _need, fast_ratio

__all__ = ["WORDS26", "ExactScanIndex", "low_vocab_stream", "missed_joins", "rand_index"]


class ExactScanIndex:
    """The semantics by brute force: every prototype of the task type, in creation order.

    ``fast=False, bounds=False`` is the plain difflib scan; ``bounds`` adds the exact-preserving quick bounds;
    ``memo`` keeps the first assignment of repeated observations (as :class:`ObservationIndex` does).
    """

    def __init__(self, threshold: float = 0.85, *, memo: bool = True, bounds: bool = True, fast: bool = True):
        self.threshold = threshold
        self.memo = memo
        self.bounds = bounds
        self.fast = fast
        self._protos: dict[str, list[tuple[int, str, Any]]] = {}
        self._memo: dict[tuple[str, str], int] = {}
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def add_prototype(self, observation: str, task_type: str = "") -> int:
        cid = self._n
        self._n += 1
        self._protos.setdefault(task_type, []).append(
            (cid, observation, PreparedText(observation) if self.fast else None))
        return cid

    def lookup(self, observation: str, task_type: str = "") -> int:
        if self.memo:
            cid = self._memo.get((task_type, observation))
            if cid is not None:
                return cid
        a = observation
        la = len(a)
        thr = self.threshold
        best, best_r = -1, -1.0
        for cid, b, prep in self._protos.get(task_type, ()):
            if self.bounds:  # difflib's blocks form a common subsequence: skip when the LCS cannot reach need
                need = _need(max(thr, best_r), la + len(b))
                if min(la, len(b)) < need or LCSseq.similarity(a, b, score_cutoff=need) < need:
                    continue
            r = fast_ratio(a, prep) if self.fast else difflib.SequenceMatcher(None, a, b).ratio()
            if r >= thr and r > best_r:
                best, best_r = cid, r
        return best

    def assign(self, observation: str, task_type: str = "") -> int:
        cid = self.lookup(observation, task_type)
        if cid < 0:
            cid = self.add_prototype(observation, task_type)
        if self.memo:
            self._memo.setdefault((task_type, observation), cid)
        return cid


def rand_index(labels_a: list, labels_b: list) -> float:
    """Pairwise agreement of two clusterings of the same items: (pairs together in both + apart in both) / pairs."""
    n = len(labels_a)
    if n != len(labels_b):
        raise ValueError("label lists differ in length")
    if n < 2:
        return 1.0

    def pairs(counter: Counter) -> int:
        return sum(c * (c - 1) // 2 for c in counter.values())

    same_a = pairs(Counter(labels_a))
    same_b = pairs(Counter(labels_b))
    same_both = pairs(Counter(zip(labels_a, labels_b)))
    total = n * (n - 1) // 2
    return (total - same_a - same_b + 2 * same_both) / total


# 26 words: the corpus on which the former candidate filter opened clusters although a prototype at ratio >= δ
# existed (tests/experience/test_clustering.py and bench/retrieval.py both use it).
WORDS26 = ["apple", "door", "north", "south", "east", "west", "key", "table", "chest", "lamp", "box", "fridge",
           "oven", "knife", "carrot", "coin", "shelf", "sofa", "bed", "counter", "cellar", "attic", "garden",
           "kitchen", "pantry", "hall"]


def low_vocab_stream(n: int = 3000, seed: int = 0) -> list[tuple[str, str]]:
    """Seeded synthetic observations from 26 words (two task types): word edits of n/8 base texts of 2-30 words."""
    rng = random.Random(seed)
    bases = [" ".join(rng.choice(WORDS26) for _ in range(rng.randint(2, 30))) for _ in range(n // 8)]
    out = []
    for _ in range(n):
        words = rng.choice(bases).split()
        for _ in range(rng.choice([0, 1, 1, 2, 3, 5, 8])):
            i, op = rng.randrange(len(words)), rng.random()
            if op < 0.4:
                words[i] = rng.choice(WORDS26)
            elif op < 0.7:
                words.insert(i, rng.choice(WORDS26))
            elif len(words) > 1:
                del words[i]
        out.append((rng.choice("ab"), " ".join(words)))
    return out


def missed_joins(got: list[int], want: list[int]) -> int:
    """Observations that opened a cluster in ``got`` although the reference (``want``) joined an existing one."""
    seen_got: set[int] = set()
    seen_want: set[int] = set()
    missed = 0
    for g, w in zip(got, want):
        missed += g not in seen_got and w in seen_want
        seen_got.add(g)
        seen_want.add(w)
    return missed
