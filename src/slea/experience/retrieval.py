"""Per-step retrieval (SLEA-RL Eq.1 / Eq.2) and rendering for the system message (App. A Eq.8).

Eq.1 — the observation's cluster has experiences: ``TopK(E+_c, k+) ∪ TopK(E−_c, k−)``, ranked by quality z, then
specificity (an example, distilled from one step in the cluster, before a pattern of a whole trajectory, before a
principle: :data:`SPECIFICITY`), then recency (last iteration used, then created), then id. The paper leaves the
order within equal z open; z takes few values (a return), so the tie-break decides most rankings.

Eq.2 — it has none: entries over the whole library whose similarity with the observation exceeds a threshold,
top k+ strategies and k− warnings by similarity (then z); they are then linked to the cluster so the next visit is
an Eq.1 hit. ``sim(o, e)`` (unspecified in the paper, §1.6) is the IDF-weighted share of the entry's content
tokens (its text plus the observation summary it was distilled from) that occur in the observation (and goal).
The score is exact over the whole library: one weighted ``bincount`` over the postings of the query's tokens (a
numpy token matrix rebuilt when entries are added or removed), so no candidate filter can drop a match.
With ``similarity="sequence"`` Eq.2 is the paper as printed instead (:func:`~slea.experience.eq2.eq2_sequence`):
sim is the clustering's difflib ratio of the observation alone and the entry's text, kept when sim > the threshold
(the manager passes δ, the clustering threshold).

Neither finds anything (an unseen game's room opens a cluster with no entries, and no lesson's words reach the
threshold): ``empty_fallback="none"`` retrieves nothing, as the paper says; ``"task_type"`` takes the task type's
best k+ strategies and k− warnings by quality z (then recency, then id) and links them to the cluster as Eq.2 does
— the released code's default retrieval (score-sorted top-k within the task type, papers.md §1.5), here only as a
last resort.

Lessons about a kind of state (:mod:`slea.experience.placeholders`) name entities by role, ``take {goal object}``;
``retrieve(..., slots=)`` fills them from the step's state-key slots, and a lesson with a role the step has no slot
for is passed over (Eq.1 takes the next best), so a retrieved lesson names only entities the observation has.

Nothing outlives a change of the library: an Eq.1 result (a function of the cluster alone) is memoised only
until the library's next mutation (any admission, link, usage update), so every call answers from the current
library — unlike the released code's permanent per-observation cache.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from slea.experience.eq2 import TokenMatrix, eq2_sequence
from slea.experience.library import ExperienceLibrary, content_tokens, sanitize
from slea.experience.placeholders import instantiate, placeholders

HEADER = "Lessons from earlier episodes (hints; use them only if they fit):"
# Ties on quality z go to the most specific lesson: an example (distilled from one step, linked to that step's
# cluster) before a pattern (a whole trajectory's plan, linked where it starts) before a principle.
SPECIFICITY = {"example": 2, "pattern": 1, "principle": 0}
POS_HEAD = "Do:"
NEG_HEAD = "Avoid:"


def approx_tokens(text: str) -> int:
    """chars/4, rounded up: the token estimate used when no tokenizer is given."""
    return (len(text) + 3) // 4


@dataclass
class Retrieved:
    entry_ids: list[int]
    text: str
    fallback: bool = False  # Eq.2 was used
    task_fallback: bool = False  # neither Eq.1 nor Eq.2 found an entry: the task type's best were taken
    texts: tuple[str, ...] = ()  # each included entry's text as shown (placeholders filled), in entry_ids' order


@lru_cache(maxsize=4096)
def _query_tokens(text: str) -> frozenset[str]:
    """The content tokens of a query (``library.content_tokens``), memoised: the same observation recurs across
    a group's copies and steps."""
    return frozenset(content_tokens(text))


@lru_cache(maxsize=16384)
def _rendered(text: str) -> str:
    """An entry's text as rendered (sanitised, at most 400 characters), memoised: the same entries recur."""
    return sanitize(text, 400)


class Retriever:
    def __init__(self, library: ExperienceLibrary, *, top_k_pos: int = 2, top_k_neg: int = 1,
                 max_tokens: int = 200, fallback_threshold: float = 0.5,
                 count_tokens: Callable[[str], int] | None = None,
                 empty_fallback: str = "none", similarity: str = "tokens") -> None:
        if empty_fallback not in ("none", "task_type"):
            raise ValueError(f"empty_fallback must be 'none' or 'task_type', not {empty_fallback!r}")
        if similarity not in ("tokens", "sequence"):
            raise ValueError(f"similarity must be 'tokens' or 'sequence', not {similarity!r}")
        self.similarity = similarity
        self.lib = library
        self.top_k = {"pos": int(top_k_pos), "neg": int(top_k_neg)}
        self.max_tokens = int(max_tokens)
        self.fallback_threshold = float(fallback_threshold)
        self.count_tokens = count_tokens or approx_tokens
        self.empty_fallback = empty_fallback
        self._tm: TokenMatrix | None = None  # Eq.2's token matrix, for one library content version
        self._eq1: dict[tuple, Retrieved] = {}  # (cluster, slots) -> Eq.1 result, for one library version only
        self._eq1_version = -1

    # -- Eq.1 ------------------------------------------------------------------------------------------------
    def _rank_key(self, eid: int) -> tuple:
        e = self.lib.get(eid)
        return (e.score, SPECIFICITY.get(e.level, 0), e.last_used_iter, e.created_iter, eid)

    def from_cluster(self, cluster_id: int, zone: str, k: int, slots: dict[str, str] | None = None) -> list[int]:
        """Eq.1 for one zone: the top ``k`` entries linked to the cluster, among those whose placeholders
        ``slots`` can fill (every entry when ``slots`` is None)."""
        if k <= 0 or cluster_id < 0:
            return []
        ids = self.lib.linked(cluster_id, zone)
        if slots is not None:
            ids = [i for i in ids if self._fillable(i, slots)]
        if not ids:
            return []
        if len(ids) <= k:
            return sorted(ids, key=self._rank_key, reverse=True)
        return heapq.nlargest(k, ids, key=self._rank_key)

    def _fillable(self, eid: int, slots: dict[str, str]) -> bool:
        e = self.lib.get(eid)
        return e is not None and all(str(slots.get(r, "")).strip() for r in placeholders(e.text))

    # -- Eq.2 ------------------------------------------------------------------------------------------------
    def _matrix(self) -> TokenMatrix:
        """The library's entries x content tokens, rebuilt lazily when its content changes (admissions and
        removals; links and usage updates leave it alone)."""
        if self._tm is None or self._tm.version != self.lib.content_version:
            self._tm = TokenMatrix(self.lib)
        return self._tm

    def similar(self, text: str, task_type: str = "", per_zone: dict[str, int] | None = None
                ) -> list[tuple[float, int]]:
        """(sim, entry id) for every entry of the task type (or untyped) with sim > threshold, best first (then
        by quality z, then id): exact over the whole library; ``tokens``: one weighted ``bincount`` over the
        postings of the query's tokens, ``sequence``: :func:`eq2_sequence` (``per_zone`` unused). ``per_zone`` ({"pos": k+, "neg": k−}) keeps only what can be among each zone's
        best k (ties at the k-th similarity kept), so the ranking in Python stays short."""
        get = self.lib.get
        if self.similarity == "sequence":  # Eq.2 as printed: difflib ratio > threshold (δ), every entry scored
            pairs = [(e.id, e.text) for e in self.lib.entries()
                     if not (task_type and e.task_type and e.task_type != task_type)]
            found = eq2_sequence(text, pairs, self.fallback_threshold)
            out = sorted(((v, get(e).score, e) for v, e in found), reverse=True)
            return [(v, eid) for v, _, eid in out]
        m = self._matrix()
        cand, sim = m.above(_query_tokens(text), self.fallback_threshold, task_type, per_zone)
        eids = m.eids[cand].tolist()  # (ids are distinct: the zone never decides the order)
        out = sorted(zip(sim.tolist(), [get(e).score for e in eids], eids), reverse=True)
        return [(v, eid) for v, _, eid in out]

    def fallback(self, text: str, task_type: str = "") -> list[int]:
        ranked = self.similar(text, task_type, per_zone=self.top_k)
        got = {"pos": [], "neg": []}
        for _, eid in ranked:
            z = self.lib.get(eid).zone
            if len(got[z]) < self.top_k[z]:
                got[z].append(eid)
            if all(len(got[zz]) >= self.top_k[zz] for zz in got):
                break
        return got["pos"] + got["neg"]

    def best_of_task(self, task_type: str = "") -> list[int]:
        """The task type's top k+ strategies and k− warnings by quality z, recency, id (untyped entries count
        for every task type, as in :meth:`similar`)."""
        out = []
        for zone in ("pos", "neg"):
            ids = [e.id for e in self.lib.entries(zone)
                   if not (e.task_type and task_type and e.task_type != task_type)]
            out += heapq.nlargest(self.top_k[zone], ids, key=self._rank_key)
        return out

    # -- both ------------------------------------------------------------------------------------------------
    def retrieve(self, observation: str, cluster_id: int, *, task_type: str = "", goal: str = "",
                 link: bool = True, slots: dict[str, str] | None = None) -> Retrieved:
        """Eq.1, else Eq.2, else the empty fallback (module docstring), rendered within B_max; ``slots``: the
        step's state-key slots that fill the lessons' placeholders (None: no state key; a lesson with a
        placeholder is then not shown)."""
        lib = self.lib
        if self._eq1_version != lib.version:  # any change to the library invalidates every memoised result
            self._eq1.clear()
            self._eq1_version = lib.version
        memo = (cluster_id, tuple(sorted((slots or {}).items())))
        hit = self._eq1.get(memo)
        if hit is not None:
            return Retrieved(list(hit.entry_ids), hit.text, False, texts=hit.texts)
        fill = slots or {}
        ids = self.from_cluster(cluster_id, "pos", self.top_k["pos"], fill) + \
            self.from_cluster(cluster_id, "neg", self.top_k["neg"], fill)
        used_fallback = used_task = False
        if not ids:
            query = f"{observation}\n{goal}" if goal and self.similarity == "tokens" else observation  # Eq.2: o_t
            ids = self.fallback(query, task_type)
            used_fallback = bool(ids)
            if not ids and self.empty_fallback == "task_type":
                ids = self.best_of_task(task_type)
                used_task = bool(ids)
            if link and cluster_id >= 0:
                for eid in ids:
                    self.lib.link_deferred(eid, cluster_id)
        text, kept, shown = self.render(ids, fill)
        res = Retrieved(kept, text, used_fallback, used_task, texts=shown)
        if ids and not (used_fallback or used_task) and cluster_id >= 0:
            self._eq1[memo] = Retrieved(list(kept), text, False, texts=shown)
        return res

    def render(self, ids: list[int], slots: dict[str, str] | None = None
               ) -> tuple[str, list[int], tuple[str, ...]]:
        """System-message text for the entries within the token budget B_max; returns (text, ids included, their
        texts as shown).

        Each entry's placeholders are filled from ``slots`` (an entry they cannot fill is left out). Strategies
        first, then warnings, each in rank order; an entry that does not fit is skipped (a later, shorter one may
        still fit); if not even the first fits, it is shortened to fit.
        """
        lib = self.lib
        items = []
        for i in ids:
            e = lib.get(i)
            shown = instantiate(_rendered(e.text), slots or {}) if e is not None else None
            if shown is not None:
                items.append((i, e, shown))
        items = [x for x in items if x[1].zone == "pos"] + [x for x in items if x[1].zone == "neg"]
        if not items:
            return "", [], ()
        count = self.count_tokens
        budget = self.max_tokens
        sel: list[tuple[int, str, str]] = []  # (id, zone, text)

        def build(chosen: list[tuple[int, str, str]]) -> str:
            lines = [HEADER]
            for zone, head in (("pos", POS_HEAD), ("neg", NEG_HEAD)):
                group = [t for _, z, t in chosen if z == zone]
                if group:
                    lines.append(head)
                    lines += ["- " + t for t in group]
            return "\n".join(lines)

        for eid, e, t in items:
            trial = sel + [(eid, e.zone, t)]
            if count(build(trial)) <= budget:
                sel = trial
            elif not sel:
                lo, hi = 0, len(t)  # longest prefix (+ ellipsis) that fits
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if count(build([(eid, e.zone, t[:mid].rstrip() + "…")])) <= budget:
                        lo = mid
                    else:
                        hi = mid - 1
                if lo >= 8:
                    sel = [(eid, e.zone, t[:lo].rstrip() + "…")]
        if not sel:
            return "", [], ()
        return build(sel), [eid for eid, _, _ in sel], tuple(t for _, _, t in sel)
