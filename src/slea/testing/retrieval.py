"""A by-hand reference for Eq.2's similarity, independent of :class:`slea.experience.retrieval.Retriever`'s
index: every entry scanned with Python sets, used by the tests and by ``bench/retrieval.py`` as the baseline."""

from __future__ import annotations

import math
import re

from slea.experience.library import STOPWORDS, ExperienceLibrary

__all__ = ["ScanEq2"]


def _tokens(text: str) -> set[str]:
    return {t for t in re.findall(r"[a-z][a-z']+", text.lower()) if t not in STOPWORDS}


class ScanEq2:
    """Eq.2 by a plain scan of every entry with Python sets. sim = the idf-weighted share of the entry's tokens
    (text + context) found in the query, with idf = log(1 + n / (1 + df)) over the library's n entries, as
    measured when the scan was built (build a new one after the library changes)."""

    def __init__(self, lib: ExperienceLibrary) -> None:
        self.entries = lib.entries()
        self.bags = {e.id: _tokens(e.text + " " + e.context) for e in self.entries}
        df: dict[str, int] = {}
        for bag in self.bags.values():
            for t in bag:
                df[t] = df.get(t, 0) + 1
        n = len(self.entries)
        self.idf = {t: math.log(1 + n / (1 + d)) for t, d in df.items()}
        self.total = {eid: sum(self.idf[t] for t in bag) for eid, bag in self.bags.items()}

    def similar(self, text: str, task_type: str, threshold: float) -> list[tuple[float, int]]:
        """(sim, entry id) of every entry of the task type (or untyped) with sim > threshold, ranked by sim,
        then score, then id, all descending."""
        q = _tokens(text)
        out = []
        for e in self.entries:
            if e.task_type and task_type and e.task_type != task_type:
                continue
            total = self.total[e.id]
            sim = sum(self.idf[t] for t in self.bags[e.id] & q) / total if total else 0.0
            if sim > threshold:
                out.append((sim, e.score, e.id))
        return [(s, eid) for s, _, eid in sorted(out, reverse=True)]

