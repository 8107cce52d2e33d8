"""The one object the collector and trainer use: clusters, per-step retrieval, evolution, persistence.

Collector (per step): ``retrieve(obs, task_type=, goal=, iteration=, state_key=, slots=)`` gives the cluster id
for the step row and the experience text for the prompt (``''`` while gated); ``cluster(obs, task_type,
state_key=)`` when no retrieval is wanted. Trainer (per iteration): ``evolve(trajectories, iteration)`` then
``save()``; ``close()`` at the end. Library and cluster index live in one SQLite file; opening an existing file
resumes both.

What a step is clustered by is ``experience.cluster_on``: the raw observation (the paper), or the env's state key
of it (:class:`slea.types.StateKey`; a step without one falls back to its observation). The library records
which (``library_meta``) and refuses to open with the other. Either way the manager remembers each cluster's
first state key, so a retrieval can say whether it matched the step's own kind of state (``right_state``).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from slea.config import ConfigError, ExperienceSection
from slea.experience.clustering import ObservationIndex
from slea.experience.extraction import GenerateText, extract_candidates, get_extractor, split_outcomes
from slea.experience.library import ExperienceLibrary, quoted_commands
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
    # the cluster's first state key equals the step's own (None: the step or the cluster has no key)
    right_state: bool | None = None
    lesson_actions: tuple[str, ...] = ()  # the commands the shown lessons quote, placeholders filled


_META_KEY = "cluster_on"  # library_meta: what the library's clusters were built on
_KEYS_SQL = "CREATE TABLE IF NOT EXISTS cluster_keys (cluster_id INTEGER PRIMARY KEY, state_key TEXT NOT NULL)"
# the distinct observations each cluster has held (CRC-32 of the text): its members, whatever it is keyed by
_MEMBERS_SQL = ("CREATE TABLE IF NOT EXISTS cluster_members (cluster_id INTEGER NOT NULL, obs_crc INTEGER NOT NULL, "
                "PRIMARY KEY (cluster_id, obs_crc))")


def check_built_on(conn, cluster_on: str) -> None:
    """Record what a new library is clustered on; refuse (one line, :class:`ConfigError`) one built on the
    other. A library older than the setting holds observation clusters."""
    conn.execute("CREATE TABLE IF NOT EXISTS library_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    row = conn.execute("SELECT value FROM library_meta WHERE key = ?", (_META_KEY,)).fetchone()
    has_clusters = conn.execute("SELECT name FROM sqlite_master WHERE name = 'obs_clusters'").fetchone()
    built = row[0] if row else ("observation" if has_clusters and conn.execute(
        "SELECT 1 FROM obs_clusters LIMIT 1").fetchone() else None)
    if built is not None and built != cluster_on:
        raise ConfigError(f"experience.cluster_on: this library was built on {built!r} clusters, the config says "
                          f"{cluster_on!r}; set experience.cluster_on={built} or start a new library")
    if row is None:
        conn.execute("INSERT OR REPLACE INTO library_meta(key, value) VALUES (?, ?)", (_META_KEY, built or cluster_on))
        conn.commit()


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
        try:
            check_built_on(self.library.conn, cfg.cluster_on)
        except ConfigError:
            self.library.close()
            raise
        self.index = ObservationIndex.load_sqlite(self.library.conn, threshold=cfg.cluster_threshold,
                                                  max_clusters=cfg.max_clusters)
        conn = self.library.conn
        conn.execute(_KEYS_SQL)
        conn.execute(_MEMBERS_SQL)
        self.cluster_keys: dict[int, str] = dict(conn.execute("SELECT cluster_id, state_key FROM cluster_keys"))
        self._members: dict[int, set[int]] = {}
        for cid, crc in conn.execute("SELECT cluster_id, obs_crc FROM cluster_members"):
            self._members.setdefault(cid, set()).add(crc)
        self._new_members: set[tuple[int, int]] = set()
        self.retriever = Retriever(self.library, top_k_pos=cfg.top_k_pos, top_k_neg=cfg.top_k_neg,
                                   max_tokens=cfg.max_tokens,
                                   # Eq.2 as printed (sequence) thresholds at δ, the clustering's
                                   fallback_threshold=(cfg.cluster_threshold if cfg.fallback_similarity == "sequence"
                                                       else cfg.fallback_threshold),
                                   similarity=cfg.fallback_similarity,
                                   empty_fallback=cfg.empty_fallback,
                                   count_tokens=count_tokens)
        self.extractor = get_extractor(cfg.extractor)(generate_text)
        if hasattr(self.extractor, "roles"):  # lessons about a kind of state, with its roles as placeholders
            self.extractor.roles = cfg.cluster_on == "state_key"
        self.stats: dict[str, float] = {"retrievals": 0, "retrieved": 0, "fallbacks": 0, "task_fallbacks": 0,
                                      "gated": 0}

    # -- per step --------------------------------------------------------------------------------------------
    def _assign(self, observation: str, task_type: str, state_key: str) -> int:
        """The step's cluster: by its state key when ``cluster_on`` says so and it has one, else by its
        observation; the cluster's first key is remembered (:meth:`right_state`)."""
        view = state_key if self.cfg.cluster_on == "state_key" and state_key else observation
        cid = self.index.assign(view, task_type)
        if cid >= 0:
            if state_key:
                self.cluster_keys.setdefault(cid, state_key)
            crc = zlib.crc32(str(observation or "").encode("utf-8", "surrogatepass"))
            held = self._members.setdefault(cid, set())
            if crc not in held:
                held.add(crc)
                self._new_members.add((cid, crc))
        return cid

    def cluster(self, observation: str, task_type: str = "", *, state_key: str = "") -> int:
        return self._assign(observation, task_type, state_key)

    def right_state(self, cluster_id: int, state_key: str) -> bool | None:
        """Whether cluster ``cluster_id`` holds the step's own kind of state: its first member's state key is
        ``state_key`` (None when either has none)."""
        first = self.cluster_keys.get(cluster_id)
        return None if not state_key or first is None else first == state_key

    def gate_open(self, iteration: int) -> bool:
        """Retrieval runs after W warm-up iterations and once the library holds C_min entries (:func:`gate`)."""
        cfg = self.cfg
        return cfg.mode != "off" and gate(iteration, len(self.library), warmup_iters=cfg.warmup_iters,
                                          min_entries=cfg.min_entries, strict=cfg.min_entries_strict)

    def _lessons_right_state(self, res, cluster_id: int, state_key: str) -> bool | None:
        """Whether a hit's lessons come from the step's own kind of state: an Eq.1 hit's cluster holds it
        (:meth:`right_state`); an Eq.2 (or task-type) hit's lessons were learned elsewhere, so each one shown must
        be linked to some other cluster whose first key is the step's. None without a key."""
        if not state_key:
            return None
        if not (res.fallback or res.task_fallback):
            return self.right_state(cluster_id, state_key)
        entries = [self.library.get(eid) for eid in res.entry_ids]
        return all(e is not None and any(c != cluster_id and self.cluster_keys.get(c) == state_key
                                         for c in e.clusters) for e in entries)

    def retrieve(self, observation: str, *, task_type: str = "", goal: str = "", iteration: int,
                 state_key: str = "", slots: dict[str, str] | None = None) -> RetrievalResult:
        """The step's cluster (:meth:`cluster`) and, once the gate is open, its lessons (Eq.1, else Eq.2) with
        their placeholders filled from ``slots``; Eq.2 matches the same text the step was clustered by."""
        cid = self._assign(observation, task_type, state_key)
        if not self.gate_open(iteration):
            self.stats["gated"] += 1
            return RetrievalResult(cid)
        view = state_key if self.cfg.cluster_on == "state_key" and state_key else observation
        res = self.retriever.retrieve(view, cid, task_type=task_type, goal=goal,
                                      slots=slots if self.cfg.cluster_on == "state_key" else None)
        self.stats["retrievals"] += 1
        self.stats["retrieved"] += bool(res.entry_ids)
        self.stats["fallbacks"] += res.fallback
        self.stats["task_fallbacks"] += res.task_fallback
        right = self._lessons_right_state(res, cid, state_key) if res.entry_ids else None
        actions = tuple(a for t in res.texts for a in quoted_commands(t))
        return RetrievalResult(cid, res.entry_ids, res.text, right, actions)

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
            self._save_keys(lib.conn)
        m.update({k: float(v) for k, v in lib.summary().items()})
        m["clusters"] = float(len(self.index))
        m.update(self.cluster_stats())
        m["evolve_s"] = time.perf_counter() - t0
        return {k: float(v) for k, v in m.items()}

    def cluster_stats(self) -> dict[str, float]:
        """The live clusters' mean number of members (the distinct observations each has held, whatever it is
        keyed by) and the share that hold one observation."""
        sizes = [len(self._members.get(cid, ())) or 1 for cid, _, _, _ in self.index.clusters()]
        if not sizes:
            return {"cluster_members": 0.0, "cluster_singletons": 0.0}
        return {"cluster_members": sum(sizes) / len(sizes),
                "cluster_singletons": sum(1 for n in sizes if n == 1) / len(sizes)}

    # -- persistence -----------------------------------------------------------------------------------------
    def _save_keys(self, conn) -> None:
        conn.executemany("INSERT OR IGNORE INTO cluster_keys(cluster_id, state_key) VALUES (?, ?)",
                         self.cluster_keys.items())
        conn.executemany("INSERT OR IGNORE INTO cluster_members(cluster_id, obs_crc) VALUES (?, ?)",
                         sorted(self._new_members))
        self._new_members.clear()

    def save(self) -> None:
        with self.library.transaction() as conn:
            self.index.save_sqlite(conn)
            self._save_keys(conn)

    def close(self) -> None:
        try:
            self.save()
        finally:
            self.library.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
