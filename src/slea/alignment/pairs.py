"""ETO-style preference pairs: each failed trajectory paired with the expert trajectory of the same task.

Episodes are :class:`slea.alignment.data.EpisodeRecord` records (or any object with their attributes); nothing
here reads files or tokenizes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slea.alignment.data import EpisodeRecord as RecordLike  # any record with its attributes


@dataclass(frozen=True)
class Pair:
    """A preference pair: the expert trajectory ``chosen`` (y_w) and a failed one ``rejected`` (y_l) of one task."""

    chosen: RecordLike
    rejected: RecordLike

    @property
    def env(self) -> str:
        return self.chosen.env

    @property
    def task(self) -> str:
        return self.chosen.task


def task_key(traj: RecordLike) -> tuple[str, str]:
    """What "the same task" means: the same environment id and task id (the split is not part of it)."""
    return traj.env, traj.task


def _expert_order(traj: RecordLike) -> tuple:
    return len(traj.turns), traj.seed, traj.source


def _failure_order(traj: RecordLike) -> tuple:
    return traj.env, traj.task, traj.seed, traj.source, traj.ret, len(traj.turns)


def build_pairs(expert: Iterable[RecordLike], failures: Iterable[RecordLike], *,
                max_per_task: int | None = None) -> list[Pair]:
    """One :class:`Pair` per failed trajectory whose task has an expert trajectory (ETO, Song et al. 2024).

    * the expert of a task is its successful expert trajectory with the fewest turns (ties: lowest seed, then
      source name); unsuccessful expert records are never used;
    * a "failure" that succeeded, or that has no turns, is left out, as is a failure whose task has no expert;
    * ``max_per_task``: keep at most this many failures per task (the first in the order below); ``None``: all.

    Deterministic: pairs are sorted by the failure's (env, task, seed, source, return, turns), so the result does
    not depend on the input order (except among failures equal in all of these).
    """
    if max_per_task is not None and max_per_task < 1:
        raise ValueError(f"max_per_task must be >= 1 or None, got {max_per_task}")
    best: dict[tuple[str, str], RecordLike] = {}
    for traj in expert:
        if not traj.success or not traj.turns:
            continue
        key = task_key(traj)
        if key not in best or _expert_order(traj) < _expert_order(best[key]):
            best[key] = traj
    kept: dict[tuple[str, str], list[RecordLike]] = defaultdict(list)
    for traj in sorted((f for f in failures if not f.success and f.turns), key=_failure_order):
        key = task_key(traj)
        if key in best and (max_per_task is None or len(kept[key]) < max_per_task):
            kept[key].append(traj)
    return [Pair(best[key], traj) for key in sorted(kept) for traj in kept[key]]


def pairing_summary(expert: Sequence[RecordLike], failures: Sequence[RecordLike],
                    pairs: Sequence[Pair]) -> dict[str, int]:
    """Counts for a run log: pairs made, tasks paired, failures left out because their task has no expert, and
    sampled trajectories that succeeded (not failures)."""
    with_expert = {task_key(t) for t in expert if t.success and t.turns}
    failed = [f for f in failures if not f.success and f.turns]
    return {
        "pairs": len(pairs),
        "tasks_paired": len({(p.env, p.task) for p in pairs}),
        "failures_without_expert": sum(task_key(f) not in with_expert for f in failed),
        "sampled_successes": sum(bool(f.success) for f in failures),
    }
