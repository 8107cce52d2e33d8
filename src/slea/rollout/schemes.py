"""Rollout schemes: how one iteration's episodes are played and cut into training rounds.

The trainer asks its scheme for the iteration's rounds (:meth:`RolloutScheme.rounds`) and runs advantages →
library → update on each, in order; a round is produced after the previous one's update, so every round is
played with the latest weights. The scheme is chosen by what the algorithm *needs* (``AlgorithmSpec.needs``,
:func:`scheme_for`), never by its name:

* :class:`OnPolicyRollouts` (the default): one round, N task groups × G copies play one episode each (DAPO
  dynamic sampling refills groups without signal, slea/rollout/sampling.py);
* :class:`SiblingRollouts` (need ``snapshots``; RTPO, Li et al. 2026 Alg.1): per task group ``rollout.trunks``
  trunk episodes record every turn boundary (no gradient); then for ``k = K−1 … 0`` one round each: G−1
  siblings fork from every trunk's boundary ``k`` (env snapshot and exact prompt ``c_k``), play on to the end
  with the current weights, and are handed to the estimator, which trains their turn-``k`` tokens alone.

Budget accounting (what ``slea compare`` matches): every round says how many rollouts it played and how many
env steps they took (:attr:`RoundRollouts.rollouts`, :attr:`RoundRollouts.env_steps`); a trunk and a sibling are one rollout
each, a sibling's env steps count from its fork on (a replay restore re-runs earlier steps inside the env:
``time/env_s`` holds that cost, the step counts do not).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from slea.envs.factory import make_pool
from slea.envs.pool import EnvPool
from slea.parallel.distributed import DataParallel
from slea.progress import Progress
from slea.rollout.collector import RolloutCollector
from slea.rollout.sampling import RoundRollouts, collect_batch, merge_shards, merge_stats

if TYPE_CHECKING:
    from slea.config import AlgorithmSection, EnvSection, RolloutSection

__all__ = ["OnPolicyRollouts", "RolloutScheme", "SchemeClass", "SiblingRollouts", "close", "last_error", "scheme_for",
           "take_fault_stats"]


class RolloutScheme(Protocol):
    pool: EnvPool  # the pool every iteration starts from
    pools: tuple[EnvPool, ...]  # every pool the scheme plays in (fault statistics, closing)

    def rounds(self, it: int, seeds: list[int]) -> Iterator[RoundRollouts]: ...


def take_fault_stats(scheme: RolloutScheme) -> dict[str, int]:
    """The fault counts of all the scheme's pools since the last call, summed (then cleared)."""
    out: dict[str, int] = {}
    for pool in scheme.pools:
        for k, v in pool.take_fault_stats().items():
            out[k] = out.get(k, 0) + v
    return out


def last_error(scheme: RolloutScheme) -> str:
    """The latest env error of the scheme's pools ('' when none)."""
    return next((p.last_error for p in scheme.pools if p.last_error), "")


def close(scheme: RolloutScheme) -> None:
    for pool in scheme.pools:
        pool.close()


def _pool(env: EnvSection, rollout: RolloutSection, copies: int, groups: int | None = None) -> EnvPool:
    return make_pool(env, groups or rollout.groups, copies)


def _bar(env: EnvSection, it: int, what: str) -> Progress:
    return Progress(f"iteration {it + 1} {what}", total=env.max_steps, unit="turns")


def _note(bar: Progress, n: int) -> Callable[[int, int], None]:
    return lambda turn, live: bar.update(turn, f"{n - live}/{n} episodes done")


class OnPolicyRollouts:
    """One round per iteration: one episode on every env of the pool (N groups × G copies). With data
    parallelism (``dp``) the pool holds this rank's share of the groups, and every rank gets the whole batch.
    ``algorithm``: dynamic sampling's settings; ``run_seed``: ``run.seed`` (the refills' seeds)."""

    def __init__(self, collector: RolloutCollector, dp: DataParallel | None = None, *, env: EnvSection,
                 rollout: RolloutSection, algorithm: AlgorithmSection, run_seed: int):
        self.collector, self.env, self.algorithm, self.run_seed = collector, env, algorithm, run_seed
        self.dp = dp or DataParallel(0, 1)
        groups = len(self.dp.block(rollout.groups))  # this rank's share of the task groups
        self.pool = make_pool(env, groups, rollout.group_size)  # env.workers: local | ray
        self.pools: tuple[EnvPool, ...] = (self.pool,)

    def rounds(self, it: int, seeds: list[int]) -> Iterator[RoundRollouts]:
        a = self.algorithm
        with _bar(self.env, it, "rollout") as bar:
            batch = collect_batch(self.collector, self.pool, self.dp.share(seeds), iteration=it,
                                  run_seed=self.run_seed, dynamic=a.dynamic_sampling,
                                  max_refill_rounds=a.max_refill_rounds, progress=_note(bar, len(self.pool)))
        yield merge_shards(self.dp.gather(batch)) if self.dp.world > 1 else batch


class SiblingRollouts:
    """RTPO's trunk-and-siblings rollouts (module docstring): ``pool`` holds the trunks (N groups ×
    ``rollout.trunks`` copies); the siblings play in a pool of their own, one group of G−1 envs per trunk.
    It takes :class:`OnPolicyRollouts`' arguments and reads neither ``algorithm`` nor ``run_seed``."""

    def __init__(self, collector: RolloutCollector, dp: DataParallel | None = None, *, env: EnvSection,
                 rollout: RolloutSection, algorithm: AlgorithmSection, run_seed: int):  # one process only
        if rollout.group_size < 2:
            raise ValueError("rollout.group_size must be >= 2: a boundary forks group_size − 1 siblings")
        self.collector, self.env = collector, env
        self.pool = _pool(env, rollout, rollout.trunks)
        self.siblings = _pool(env, rollout, rollout.group_size - 1, groups=len(self.pool))
        self.pools: tuple[EnvPool, ...] = (self.pool, self.siblings)

    def rounds(self, it: int, seeds: list[int]) -> Iterator[RoundRollouts]:
        with _bar(self.env, it, "trunks") as bar:
            trunks, stats = self.collector.collect(self.pool, seeds, iteration=it, boundaries=True,
                                                   progress=_note(bar, len(self.pool)))
        depth = max((len(t.boundaries) for t in trunks), default=0)
        if depth == 0:  # no trunk played a turn (every reset faulted): nothing to fork, the episodes still count
            yield RoundRollouts(trajs=[], collected=trunks, stats=stats)
        for k in reversed(range(depth)):  # K−1 … 0: each round is played after the previous round's update
            starts = {i: (t, t.boundaries[k]) for n, t in enumerate(trunks) if len(t.boundaries) > k
                      for i in self.siblings.members(n)}
            with _bar(self.env, it, f"turn {k} siblings") as bar:
                sibs, st = self.collector.fork(self.siblings, starts, iteration=it, traj_offset=len(self.pool),
                                               progress=_note(bar, len(starts)))
            for s in sibs:  # one group per (trunk, boundary): unique over the iteration
                s.group_id = s.group_id * depth + k
                for row in s.steps:
                    row.group_id = s.group_id
            first = k == depth - 1
            metrics = {"rollout/forked_boundaries": float(len(starts) // self.siblings.group_size),
                       "rollout/sibling_rollouts": float(len(sibs))}
            if first:
                metrics.update({"rollout/trunk_rollouts": float(len(trunks)), "rollout/turns_forked": float(depth)})
            yield RoundRollouts(trajs=sibs, collected=trunks if first else [], stats=merge_stats(stats, st) if first else st,
                        metrics=metrics, continuations=sibs)


class SchemeClass(Protocol):
    """A rollout scheme's constructor: the collector, the data parallelism and the settings it reads."""

    def __call__(self, collector: RolloutCollector, dp: DataParallel | None = None, *, env: EnvSection,
                 rollout: RolloutSection, algorithm: AlgorithmSection, run_seed: int) -> RolloutScheme: ...


# need -> scheme: the first of an algorithm's needs (sorted) that has a scheme picks it, else the on-policy one
SCHEMES: dict[str, SchemeClass] = {"snapshots": SiblingRollouts}


def scheme_for(needs: frozenset[str]) -> SchemeClass:
    """The rollout scheme an algorithm with ``needs`` trains with."""
    return next((SCHEMES[n] for n in sorted(needs) if n in SCHEMES), OnPolicyRollouts)
