"""One iteration's rollout batch, with DAPO dynamic sampling when ``algorithm.dynamic_sampling`` is on.

DAPO (Yu et al. 2025, §3.2 "Dynamic Sampling"): a task group whose G episodes all got the same return gives
every one of them a zero group-relative advantage, so it carries no policy gradient and only shrinks the
effective batch. With dynamic sampling such groups are dropped and more groups are collected (fresh env seeds:
:func:`refill_seeds`, a pure function of (run seed, iteration, round), so runs stay reproducible) until the
batch again holds ``rollout.groups`` groups with signal, or ``algorithm.max_refill_rounds`` extra collection
rounds are spent (then the batch trains short, and ``sampling/short_groups`` says by how much). Groups with
signal beyond the target are not trained on (``sampling/surplus_groups``), as DAPO truncates to its batch.

Every episode played is still counted: train metrics, ``episodes``/``env_steps`` and the experience library
see all of them (:attr:`RoundRollouts.collected`); only the advantage estimator and the update see
:attr:`RoundRollouts.trajs`. Group ids are made unique across rounds (round ``r``'s group ``g`` becomes
``r·groups + g``) and trajectory ids by the collector's ``traj_offset``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from slea.rollout.collector import RolloutStats
from slea.types import Trajectory

__all__ = ["RoundRollouts", "collect_batch", "iteration_seeds", "merge_shards", "merge_stats", "refill_seeds", "zero_variance_groups"]


@dataclass
class RoundRollouts:
    """One training round's rollouts (slea/rollout/schemes.py)."""

    trajs: list[Trajectory]  # what the advantage estimator and the update see
    collected: list[Trajectory]  # every whole episode played (train metrics, env steps, library)
    stats: RolloutStats
    metrics: dict[str, float] = field(default_factory=dict)
    # rollouts forked mid-episode (RTPO's siblings): counted in the budgets, not in the episode metrics
    continuations: list[Trajectory] = field(default_factory=list)
    seconds: float = 0.0  # wall seconds it took to play (set by the trainer: its time/rollout_s)

    @property
    def env_steps(self) -> int:
        """Env steps played in this round (episodes and continuations)."""
        return sum(len(t.steps) for t in self.collected) + sum(len(t.steps) for t in self.continuations)

    @property
    def rollouts(self) -> int:
        """Rollouts played in this round: episodes and continuations, one each (a continuation whose restore
        faulted played nothing and is not counted)."""
        return len(self.collected) + sum(1 for t in self.continuations if t.steps)


def iteration_seeds(run_seed: int, iteration: int, groups: int) -> list[int]:
    """Env seeds of an iteration's task groups: a pure function of (run seed, iteration), so a resumed run
    and a compared algorithm see the same tasks."""
    rng = np.random.default_rng([run_seed, iteration])
    return [int(s) for s in rng.integers(0, 2**31 - 1, size=groups)]


def refill_seeds(run_seed: int, iteration: int, round_: int, groups: int) -> list[int]:
    """Env seeds of refill round ``round_ ≥ 1`` of an iteration (round 0 is :func:`iteration_seeds`)."""
    if round_ < 1:
        raise ValueError("refill rounds count from 1")
    rng = np.random.default_rng([run_seed, iteration, round_])
    return [int(s) for s in rng.integers(0, 2**31 - 1, size=groups)]


def zero_variance_groups(trajs: list[Trajectory], tol: float = 1e-9) -> set[int]:
    """Group ids whose episode returns are all equal (within ``tol``), including single-episode groups."""
    by: dict[int, list[float]] = {}
    for t in trajs:
        by.setdefault(t.group_id, []).append(t.episode_return)
    return {g for g, r in by.items() if len(r) < 2 or max(r) - min(r) <= tol}


def merge_stats(a: RolloutStats, b: RolloutStats) -> RolloutStats:
    """The sum of two collections' rollout statistics."""
    out = RolloutStats()
    for f in fields(RolloutStats):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, dict):
            merged = dict(x)
            for k, v in y.items():
                merged[k] = merged.get(k, 0) + v
            setattr(out, f.name, merged)
        else:
            setattr(out, f.name, x + y)
    return out


def _relabel(trajs: list[Trajectory], offset: int) -> None:
    if not offset:
        return
    for t in trajs:
        t.group_id += offset
        for s in t.steps:
            s.group_id = t.group_id


def collect_batch(collector, pool, seeds: list[int], *, iteration: int, run_seed: int, dynamic: bool,
                  max_refill_rounds: int, progress=None) -> RoundRollouts:
    """Collect one episode per env of ``pool`` for ``seeds`` and, when ``dynamic``, drop the groups with
    zero return variance and refill (see the module docstring). Without ``dynamic`` this is exactly one
    ``collector.collect`` call."""
    trajs, stats = collector.collect(pool, seeds, iteration=iteration, progress=progress)
    if not dynamic:
        return RoundRollouts(trajs, trajs, stats)
    target = len(seeds)
    collected = list(trajs)
    kept: list[Trajectory] = []
    n_kept = dropped = surplus = refilled = 0

    def take(batch: list[Trajectory], round_: int) -> None:
        nonlocal n_kept, dropped, surplus, refilled
        flat = zero_variance_groups(batch)
        order = list(dict.fromkeys(t.group_id for t in batch))
        for g in order:
            if g in flat:
                dropped += 1
            elif n_kept < target:
                kept.extend(t for t in batch if t.group_id == g)
                n_kept += 1
                refilled += round_ > 0
            else:
                surplus += 1

    take(trajs, 0)
    rounds = 0
    while n_kept < target and rounds < max_refill_rounds:
        rounds += 1
        more, st = collector.collect(pool, refill_seeds(run_seed, iteration, rounds, len(seeds)),
                                     iteration=iteration, traj_offset=rounds * len(pool), progress=progress)
        _relabel(more, rounds * len(seeds))
        stats = merge_stats(stats, st)
        collected.extend(more)
        take(more, rounds)
    metrics = {"sampling/dropped_groups": float(dropped), "sampling/refill_rounds": float(rounds),
               "sampling/refilled_groups": float(refilled), "sampling/kept_groups": float(n_kept),
               "sampling/short_groups": float(target - n_kept), "sampling/surplus_groups": float(surplus),
               "sampling/collected_groups": float(target * (rounds + 1))}
    return RoundRollouts(kept, collected, stats, metrics)


def merge_shards(parts: list[RoundRollouts]) -> RoundRollouts:
    """The batches the data-parallel ranks collected on their shares of the task groups, as one batch, in rank
    order. Group and trajectory ids are shifted past the previous ranks' so they stay unique; rank ``r`` played
    groups ``g0..`` of the iteration, so without dynamic sampling the ids equal those of one process playing all
    groups."""
    group_off = traj_off = 0
    for part in parts:
        unique = {id(t): t for t in part.collected + part.trajs}.values()  # trajs is often collected itself
        top_group = max((t.group_id for t in unique), default=-1)
        top_traj = max((t.traj_id for t in unique), default=-1)
        for t in unique:
            t.group_id += group_off
            t.traj_id += traj_off
            for s in t.steps:
                s.group_id, s.traj_id = t.group_id, t.traj_id
        group_off += top_group + 1
        traj_off += top_traj + 1
    stats = parts[0].stats
    for part in parts[1:]:
        stats = merge_stats(stats, part.stats)
    metrics: dict[str, float] = {}
    for part in parts:
        for key, v in part.metrics.items():
            metrics[key] = metrics.get(key, 0.0) + v
    return RoundRollouts([t for p in parts for t in p.trajs], [t for p in parts for t in p.collected], stats, metrics)
