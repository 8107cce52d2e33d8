"""The one object the collector and trainer use: clusters, per-step retrieval, evolution, persistence.

Collector (per step): ``retrieve(obs, task_type=, goal=, iteration=)`` gives the cluster id for the step row and
the experience text for the system message (``''`` while gated); ``cluster(obs, task_type)`` when no retrieval
is wanted. Trainer (per iteration): ``evolve(trajectories, iteration)`` then ``save()``; ``close()`` at the end.
Library and cluster index live in one SQLite file; opening an existing file resumes both.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from slea.config import ExperienceSection
from slea.experience.clustering import ObservationIndex
from slea.experience.extraction import GenerateText, extract_candidates, get_extractor, split_outcomes
from slea.experience.library import ExperienceLibrary
from slea.experience.retrieval import Retriever
from slea.types import Trajectory


def gate(iteration: int, size: int, *, warmup_iters: int, min_entries: int, strict: bool = False) -> bool:
    """SLEA-RL (Wang & Jiang 2026) §3, the retrieval gate: experiences are retrieved only after W warm-up epochs
    (``iteration >= W``, iterations counted from 0) and when the library is large enough — ``|E| > C_min`` as
    printed (``strict``), or ``|E| >= C_min`` (the default, as the released code). An empty library never opens
    it."""
    enough = size > min_entries if strict else size >= min_entries
    return iteration >= warmup_iters and enough and size > 0


@dataclass
class RetrievalResult:
    cluster_id: int
    entry_ids: list[int] = field(default_factory=list)
    text: str = ""  # '' when nothing was retrieved


class ExperienceManager:
    def __init__(self, cfg: ExperienceSection, path: str | Path | None = None,
                 generate_text: GenerateText | None = None, *,
                 count_tokens: Callable[[str], int] | None = None) -> None:
        self.cfg = cfg
        self.path = Path(path) if path is not None else None
        self.generate_text = generate_text
        self.library = ExperienceLibrary(path, capacity_pos=cfg.capacity_pos, capacity_neg=cfg.capacity_neg,
                                         novelty_threshold=cfg.novelty_threshold,
                                         use_embeddings=cfg.use_embeddings)
        self.index = ObservationIndex.load_sqlite(self.library.conn, threshold=cfg.cluster_threshold,
                                                  max_clusters=cfg.max_clusters)
        self.retriever = Retriever(self.library, top_k_pos=cfg.top_k_pos, top_k_neg=cfg.top_k_neg,
                                   max_tokens=cfg.max_tokens,
                                   # Eq.2 as printed (sequence) thresholds at δ, the clustering's
                                   fallback_threshold=(cfg.cluster_threshold if cfg.fallback_similarity == "sequence"
                                                       else cfg.fallback_threshold),
                                   similarity=cfg.fallback_similarity,
                                   empty_fallback=cfg.empty_fallback,
                                   count_tokens=count_tokens)
        self.extractor = get_extractor(cfg.extractor)(generate_text)
        self.stats: dict[str, float] = {"retrievals": 0, "retrieved": 0, "fallbacks": 0, "task_fallbacks": 0,
                                      "gated": 0}

    # -- per step --------------------------------------------------------------------------------------------
    def cluster(self, observation: str, task_type: str = "") -> int:
        return self.index.assign(observation, task_type)

    def gate_open(self, iteration: int) -> bool:
        """Retrieval runs after W warm-up iterations and once the library holds C_min entries (:func:`gate`)."""
        cfg = self.cfg
        return cfg.mode != "off" and gate(iteration, len(self.library), warmup_iters=cfg.warmup_iters,
                                          min_entries=cfg.min_entries, strict=cfg.min_entries_strict)

    def retrieve(self, observation: str, *, task_type: str = "", goal: str = "",
                 iteration: int) -> RetrievalResult:
        cid = self.index.assign(observation, task_type)
        if not self.gate_open(iteration):
            self.stats["gated"] += 1
            return RetrievalResult(cid)
        res = self.retriever.retrieve(observation, cid, task_type=task_type, goal=goal)
        self.stats["retrievals"] += 1
        self.stats["retrieved"] += bool(res.entry_ids)
        self.stats["fallbacks"] += res.fallback
        self.stats["task_fallbacks"] += res.task_fallback
        return RetrievalResult(cid, res.entry_ids, res.text)

    # -- per iteration ---------------------------------------------------------------------------------------
    def evolve(self, trajectories: list[Trajectory], iteration: int) -> dict[str, float]:
        """Usage/success of the entries used, extraction, admission and index save: one transaction."""
        t0 = time.perf_counter()
        cfg = self.cfg
        lib = self.library
        m: dict[str, float] = {"added": 0, "replaced": 0, "duplicate": 0, "rejected": 0,
                               "admitted_pos": 0, "admitted_neg": 0, "used_entries": 0, "used_success": 0}
        with lib.transaction():
            if trajectories:
                _, better, _ = split_outcomes(trajectories, cfg.eta, cfg.eta_tie)
                better_ids = {id(t) for t in better}
                for t in trajectories:
                    ok = bool(t.won) or id(t) in better_ids
                    for eid in dict.fromkeys(e for s in t.steps for e in s.experience_ids):
                        if eid in lib:
                            lib.record_usage(eid, success=ok, iteration=iteration)
                            m["used_entries"] += 1
                            m["used_success"] += ok
            _, cands, info = extract_candidates(trajectories, eta=cfg.eta, k_traj=cfg.k_traj,
                                                extractor=self.extractor, eta_tie=cfg.eta_tie,
                                                warning_score=cfg.warning_score)
            m.update(info)
            caps = {"pos": cfg.k_strat, "neg": cfg.k_warn}
            admitted = {"pos": 0, "neg": 0}
            for c in cands:
                if admitted[c.zone] >= caps[c.zone]:
                    m["rate_limited"] = m.get("rate_limited", 0) + 1
                    continue
                r = lib.add(c.text, c.zone, c.level, c.score, task_type=c.task_type, context=c.context,
                            sources=c.sources, clusters=c.clusters, iteration=iteration)
                m[r.status] += 1
                if r.status in ("added", "replaced"):
                    admitted[c.zone] += 1
            m["admitted_pos"], m["admitted_neg"] = admitted["pos"], admitted["neg"]
            self.index.save_sqlite(lib.conn)
        m.update({k: float(v) for k, v in lib.summary().items()})
        m["clusters"] = float(len(self.index))
        m["evolve_s"] = time.perf_counter() - t0
        return {k: float(v) for k, v in m.items()}

    # -- persistence -----------------------------------------------------------------------------------------
    def save(self) -> None:
        with self.library.transaction() as conn:
            self.index.save_sqlite(conn)

    def close(self) -> None:
        try:
            self.save()
        finally:
            self.library.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
