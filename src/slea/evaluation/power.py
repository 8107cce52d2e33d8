"""How many paired seeds a study needs: the power of the exact sign-flip test, by simulation from a pilot.

A confirmatory study is sized before its runs. Its test is :func:`slea.evaluation.stats.sign_flip_pvalue`, the
exact two-sided sign-flip (permutation) test over per-seed differences (Fisher 1935; Pitman 1937). Its power at
``n`` seeds, under a model of what one fresh seed's difference looks like, is the share of simulated studies of
``n`` seeds whose p falls below ``alpha`` with a positive mean (the criterion is one-directional even though the
test is two-sided). The model used here is the pilot's own (Efron & Tibshirani 1993, ch. 25, "bootstrap power
calculations"):

* each fresh seed's difference is a draw, with replacement, from the pilot's per-seed differences;
* with probability ``loss_rate`` the baseline scores on that seed too: a score drawn from ``baseline_scores`` is
  subtracted from the drawn difference (default: the pilot's nonzero ``|differences|``, a baseline as strong as
  the method where it wins). A pilot in which the baseline never won says nothing about how often it can, so this
  rate and these scores are assumptions, stated beside the result.

The p-values are exact: a zero difference flips onto itself, so it drops out of the test (the share of the 2^n
sign assignments with ``|sum| ≥ |observed sum|`` is the same with or without it), and the 2^k sums of the k
nonzero differences are enumerated (:func:`exact_sign_flip_pvalue`). Pure functions; every draw comes from a seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["PowerResult", "exact_sign_flip_pvalue", "seeds_for_power", "sign_flip_power"]

MAX_NONZERO = 40  # 2 x 2^20 half-sums (16 MB of float64) at most per p-value
_TIE = 1e-9  # relative tolerance for |sum| ≥ |observed| (sums of the same values in another order)


def _all_sums(d: np.ndarray) -> np.ndarray:
    sums = np.zeros(1)
    for x in d:  # every sign assignment's sum, by doubling: 1, 2, 4, ..., 2^len(d) sums
        sums = np.concatenate([sums + x, sums - x])
    return sums


def exact_sign_flip_pvalue(diffs: Sequence[float]) -> float:
    """The exact two-sided sign-flip p-value of ``diffs`` with the mean (equivalently the sum) as statistic: the
    share of the 2^k sign assignments of the k nonzero differences whose ``|sum|`` is at least the observed one.
    Zeros are dropped first (each flips onto itself); no nonzero difference, or an observed sum of 0, gives 1.
    Meet in the middle: the 2^(k/2) sums of each half are enumerated, and the pairs far enough out are counted by
    binary search, so k up to :data:`MAX_NONZERO` stays exact. Equal to
    :func:`slea.evaluation.stats.sign_flip_pvalue` wherever that one is exact."""
    d = np.asarray([x for x in diffs if x != 0], dtype=np.float64)
    k = d.size
    if k > MAX_NONZERO:
        raise ValueError(f"{k} nonzero differences: at most {MAX_NONZERO} are enumerated")
    observed = abs(float(d.sum()))
    if k == 0 or observed == 0:
        return 1.0
    left, right = _all_sums(d[: k // 2]), np.sort(_all_sums(d[k // 2:]))
    bound = observed * (1 - _TIE)
    upper = right.size - np.searchsorted(right, bound - left, side="left")  # left + right ≥ bound
    lower = np.searchsorted(right, -bound - left, side="right")  # left + right ≤ −bound
    return float((upper.sum() + lower.sum()) / (left.size * right.size))


def _draw_study(rng: np.random.Generator, pilot: np.ndarray, baseline: np.ndarray, n: int,
                loss_rate: float) -> np.ndarray:
    diffs = rng.choice(pilot, size=n, replace=True)
    if loss_rate > 0 and baseline.size:
        scored = rng.random(n) < loss_rate
        diffs[scored] -= rng.choice(baseline, size=int(scored.sum()), replace=True)
    return diffs


@dataclass(frozen=True)
class PowerResult:
    """The simulated power of one design: ``n`` seeds, ``loss_rate``, ``n_sims`` simulated studies of which
    ``passed`` had a positive mean and p < ``alpha``."""

    n: int
    loss_rate: float
    alpha: float
    n_sims: int
    passed: int

    @property
    def power(self) -> float:
        return self.passed / self.n_sims

    @property
    def stderr(self) -> float:
        """The Monte Carlo standard error of :attr:`power` (binomial)."""
        return float(np.sqrt(self.power * (1 - self.power) / self.n_sims))


def sign_flip_power(pilot: Sequence[float], n: int, *, loss_rate: float = 0.0,
                    baseline_scores: Sequence[float] | None = None, alpha: float = 0.05, n_sims: int = 10_000,
                    seed: int = 0) -> PowerResult:
    """The power of a study of ``n`` paired seeds (module docstring's model): the share of ``n_sims`` simulated
    studies, each of ``n`` differences drawn from ``pilot`` (and, with probability ``loss_rate`` per seed, minus a
    baseline score drawn from ``baseline_scores``), whose exact sign-flip p is below ``alpha`` with a positive
    mean."""
    p = np.asarray(pilot, dtype=np.float64)
    if p.size == 0 or n < 1:
        raise ValueError("a pilot of at least one difference and n ≥ 1 seeds are needed")
    if not 0.0 <= loss_rate <= 1.0:
        raise ValueError(f"loss_rate {loss_rate} is not a probability")
    baseline = np.abs(np.asarray(baseline_scores, dtype=np.float64) if baseline_scores is not None else p[p != 0])
    rng = np.random.default_rng(seed)
    passed = 0
    for _ in range(n_sims):
        diffs = _draw_study(rng, p, baseline, n, loss_rate)
        if diffs.sum() > 0 and exact_sign_flip_pvalue(diffs) < alpha:
            passed += 1
    return PowerResult(n=n, loss_rate=loss_rate, alpha=alpha, n_sims=n_sims, passed=passed)


def seeds_for_power(pilot: Sequence[float], *, target: float = 0.8, loss_rate: float = 0.0,
                    baseline_scores: Sequence[float] | None = None, alpha: float = 0.05, n_sims: int = 10_000,
                    seed: int = 0, n_min: int = 1, n_max: int = 64) -> tuple[int | None, list[PowerResult]]:
    """The smallest number of seeds whose simulated power reaches ``target`` (None when none up to ``n_max``
    does), and the power curve from ``n_min`` seeds up to it. Every ``n`` uses the same ``seed``, so the curve is
    reproducible."""
    curve: list[PowerResult] = []
    for n in range(n_min, n_max + 1):
        curve.append(sign_flip_power(pilot, n, loss_rate=loss_rate, baseline_scores=baseline_scores, alpha=alpha,
                                     n_sims=n_sims, seed=seed))
        if curve[-1].power >= target:
            return n, curve
    return None, curve
