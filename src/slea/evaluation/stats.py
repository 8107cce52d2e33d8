"""Statistics of a comparison of two arms (methods, variants) paired by seed: pure functions, no I/O.

Two arms trained with the same seeds play the same task groups and are evaluated on the same held-out games
(``eval.seed + g``), so each seed gives one paired difference ``a − b`` of a held-out score, and each held-out game
of a seed one paired game-level difference. Over those:

* :func:`paired_differences` — the per-seed differences over the seeds both arms have;
* :func:`mean_std` — their mean and standard deviation (ddof = 1);
* :func:`sign_flip_pvalue` — the exact two-sided sign-flip permutation test over seeds (Fisher 1935; Pitman
  1937): under "no difference" each seed's difference is as likely to have either sign, so the p-value is the
  fraction of the 2^n sign assignments whose mean is at least as far from 0 as the observed one
  (``scipy.stats.permutation_test``, ``permutation_type='samples'``, every assignment enumerated);
* :func:`min_sign_flip_pvalue` — the smallest p that test can give with n seeds, 2 / 2^n: with 3 seeds 0.25, so no
  3-seed comparison can reach p < 0.05 whatever the data (it takes 6 seeds: 2 / 64 = 0.031);
* :func:`hierarchical_bootstrap_ci` — a percentile bootstrap confidence interval for the mean difference that
  resamples seeds and then, within each drawn seed, its held-out games (a two-level, hierarchical bootstrap:
  Davison & Hinkley 1997, §3.8; Efron's percentile interval), so both the seed-to-seed spread and the finite
  held-out set are in the interval; :func:`seed_bootstrap_ci` is the one-level percentile bootstrap over seeds
  (Efron 1979; ``scipy.stats.bootstrap``) for scores with no per-game values;
* :func:`paired_comparison` — all of it for one pair, with the verdict: "separated" only at p < ``alpha`` (0.05).

A held-out game's score is :func:`per_game_success` of an evaluation result (``per_game_wins`` over the episodes per
game). Every random draw comes from a fixed seed, so a table re-made from the same runs gives the same interval.

Not used: rliable (Agarwal et al. 2021). It installs from the registry, but brings arch, statsmodels, seaborn and
pandas, and what it adds does not fit these comparisons: its IQM trims a quarter of the runs at each end (2 of 8
seeds, and nothing sensible of 3), and its stratified bootstrap resamples runs within each task of a multi-task
benchmark, one level and unpaired, where these comparisons are one task, paired by seed, with held-out games
inside each seed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["ALPHA", "PairedComparison", "format_ci", "format_mean_std", "format_p", "hierarchical_bootstrap_ci", "markdown_table",
           "mean_std", "min_sign_flip_pvalue", "paired_comparison", "paired_differences", "per_game_success",
           "seed_bootstrap_ci", "sign_flip_pvalue", "summary_line"]

ALPHA = 0.05  # "separated" only below this p
CONFIDENCE = 0.95
N_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
EXACT_MAX_N = 20  # up to 2^20 sign assignments are enumerated; beyond, a fixed-seed Monte Carlo sample


def _finite(x: Any) -> bool:
    return x is not None and isinstance(x, (int, float, np.floating, np.integer)) and math.isfinite(float(x))


def paired_differences(a: Mapping[int, float | None], b: Mapping[int, float | None]
                       ) -> tuple[list[int], list[float]]:
    """The seeds both arms have a finite value for (sorted) and the differences ``a[s] − b[s]`` on them."""
    seeds = sorted(s for s in a if s in b and _finite(a[s]) and _finite(b[s]))
    return seeds, [float(a[s]) - float(b[s]) for s in seeds]


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and standard deviation with ddof = 1 (Bessel's correction); the std is None for fewer than two values
    and both are None for none."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return None, None
    return float(v.mean()), (float(v.std(ddof=1)) if v.size > 1 else None)


def min_sign_flip_pvalue(n: int) -> float | None:
    """The smallest two-sided p-value the exact sign-flip test can reach with ``n`` paired seeds: the observed
    assignment and its mirror image are 2 of the 2^n, so 2 / 2^n (1 for n = 1; None for n = 0)."""
    if n <= 0:
        return None
    return min(1.0, 2.0 / 2.0 ** n)


def sign_flip_pvalue(diffs: Sequence[float], *, max_exact: int = EXACT_MAX_N, n_resamples: int = 100_000,
                     seed: int = BOOTSTRAP_SEED) -> tuple[float | None, bool]:
    """Two-sided p-value of the paired sign-flip permutation test (Fisher 1935, Pitman 1937) of "the mean
    difference is 0", with the mean as the statistic, and whether it is exact.

    Under the null each difference is as likely to be +d as −d; the p-value is the fraction of the 2^n sign
    assignments whose mean is at least as extreme as the observed one (scipy.stats.permutation_test with
    ``permutation_type='samples'``, two-sided = twice the smaller tail, capped at 1; the sign-flip distribution is
    symmetric, so this is the fraction with |mean| ≥ |observed|). All 2^n assignments are enumerated for
    n ≤ ``max_exact``; beyond, ``n_resamples`` random ones from ``seed``. A zero difference flips to itself, so
    8 seeds all positive give 2/256 = 0.0078 and (0.6, 0.2, 0) gives 0.5. None (and not exact) for no seeds; 1
    (exact) for one seed or all differences 0."""
    d = np.asarray(diffs, dtype=np.float64)
    n = d.size
    if n == 0:
        return None, False
    if n == 1 or not np.any(d):  # scipy needs two observations; one flips onto |d| itself
        return 1.0, True
    from scipy import stats

    exact = n <= max_exact
    res = stats.permutation_test((d,), lambda x, axis: np.mean(x, axis=axis), permutation_type="samples",
                                 vectorized=True, n_resamples=np.inf if exact else n_resamples,
                                 alternative="two-sided", rng=np.random.default_rng(seed))
    return float(min(1.0, res.pvalue)), exact


def _percentile(boot: np.ndarray, confidence: float) -> tuple[float, float]:
    lo, hi = np.quantile(boot, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(lo), float(hi)


def hierarchical_bootstrap_ci(per_seed: Sequence[Sequence[float]], *, confidence: float = CONFIDENCE,
                              n_resamples: int = N_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                              chunk: int = 2_000) -> tuple[float, float] | None:
    """Percentile confidence interval of the mean over seeds of each seed's mean over its held-out games, by a
    two-level (hierarchical) bootstrap (Davison & Hinkley 1997, §3.8; Efron's percentile interval): each resample
    draws n seeds with replacement, then, for every drawn seed, as many of its games as it has, with replacement,
    and takes the mean over the drawn seeds of their drawn games' mean.

    ``per_seed``: one sequence per seed of game-level values (for a paired comparison, the difference a − b on
    each held-out game; seeds may hold different numbers of games). With one value per seed it is the one-level
    bootstrap over seeds (:func:`seed_bootstrap_ci`, checked against ``scipy.stats.bootstrap`` in the tests).
    Vectorised over resamples in chunks of ``chunk``; draws from ``numpy.random.default_rng(seed)``. None without
    a seed or with an empty one."""
    rows = [np.asarray(g, dtype=np.float64).ravel() for g in per_seed]
    if not rows or any(r.size == 0 for r in rows):
        return None
    n = len(rows)
    sizes = np.array([r.size for r in rows])
    width = int(sizes.max())
    table = np.zeros((n, width))
    for i, r in enumerate(rows):
        table[i, : r.size] = r
    rng = np.random.default_rng(seed)
    out = np.empty(n_resamples)
    for start in range(0, n_resamples, chunk):
        b = min(chunk, n_resamples - start)
        s = rng.integers(0, n, size=(b, n))  # drawn seeds
        m = sizes[s]  # games each drawn seed has
        g = np.minimum((rng.random((b, n, width)) * m[..., None]).astype(np.int64), m[..., None] - 1)
        vals = table[s[..., None], g]  # (b, n, width): drawn games of the drawn seeds
        valid = np.arange(width)[None, None, :] < m[..., None]  # a seed with fewer games uses its first m slots
        seed_means = (vals * valid).sum(axis=2) / m
        out[start:start + b] = seed_means.mean(axis=1)
    return _percentile(out, confidence)


def seed_bootstrap_ci(values: Sequence[float], *, confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES,
                      seed: int = BOOTSTRAP_SEED) -> tuple[float, float] | None:
    """Percentile bootstrap confidence interval of the mean over seeds (Efron 1979), one level:
    ``scipy.stats.bootstrap`` with ``method='percentile'`` (BCa needs more than a handful of values). A point for
    one value or all-equal values; None for none."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return None
    if v.size == 1 or np.all(v == v[0]):
        return float(v[0]), float(v[0])
    from scipy import stats

    res = stats.bootstrap((v,), np.mean, confidence_level=confidence, n_resamples=n_resamples,
                          method="percentile", rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def per_game_success(result: Mapping[str, Any] | None) -> list[float] | None:
    """Each held-out game's sampled success from an evaluation result (``eval/summary.json``'s ``after``, an
    ``eval-<split>.json``): ``per_game_wins`` over the sampled episodes per game; None when it has no per-game
    wins."""
    if not result:
        result = {}
    wins = result.get("per_game_wins")
    sampled = result.get("sampled") or {}
    games = result.get("games") or (len(wins) if wins else 0)
    episodes = sampled.get("episodes")
    if not wins or not games or not episodes or len(wins) != games:
        return None
    per = float(episodes) / games
    return [w / per for w in wins]


@dataclass(frozen=True)
class PairedComparison:
    """One pair of arms, paired by seed: ``a − b`` of ``metric``.

    ``diffs`` per seed (``seeds``); ``mean``, ``std`` (ddof = 1); ``p``: the exact two-sided sign-flip p over
    seeds (:func:`sign_flip_pvalue`) and ``p_min`` the smallest the design can reach (:func:`min_sign_flip_pvalue`);
    ``ci``: the bootstrap interval at ``confidence``, by ``ci_method`` (``"seeds, then games"``: the hierarchical
    bootstrap over ``games`` held-out games per seed; ``"seeds"``: over seeds only, where the arms have no paired
    per-game values); ``separated``: p < ``alpha``."""

    a: str
    b: str
    metric: str
    seeds: tuple[int, ...]
    diffs: tuple[float, ...]
    mean: float | None
    std: float | None
    p: float | None
    p_exact: bool
    p_min: float | None
    ci: tuple[float, float] | None
    confidence: float
    ci_method: str
    games: int | None
    alpha: float = ALPHA

    @property
    def n(self) -> int:
        return len(self.seeds)

    @property
    def separated(self) -> bool:
        return self.p is not None and self.p < self.alpha

    @property
    def verdict(self) -> str:
        return "separated" if self.separated else "not separated"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["seeds"], d["diffs"] = list(self.seeds), list(self.diffs)
        d["ci"] = list(self.ci) if self.ci is not None else None
        return {**d, "n": self.n, "separated": self.separated, "verdict": self.verdict}


def paired_comparison(a: Mapping[int, float | None], b: Mapping[int, float | None], *,
                      a_games: Mapping[int, Sequence[float] | None] | None = None,
                      b_games: Mapping[int, Sequence[float] | None] | None = None,
                      names: tuple[str, str] = ("a", "b"), metric: str = "held-out success",
                      confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                      alpha: float = ALPHA) -> PairedComparison:
    """The comparison ``a − b`` over the seeds both have (``{seed: score}``): per-seed differences, mean ± std,
    the exact sign-flip p and the smallest reachable p, and the bootstrap CI — hierarchical (seeds, then games)
    when every paired seed has per-game values of the same length in both arms (``a_games``/``b_games``,
    ``{seed: [score per held-out game]}``: the same games, so their differences pair game by game), else over
    seeds only (:func:`seed_bootstrap_ci`)."""
    seeds, diffs = paired_differences(a, b)
    mean, std = mean_std(diffs)
    p, exact = sign_flip_pvalue(diffs)
    games = None
    per_game: list[np.ndarray] = []
    if seeds and a_games and b_games:
        for s in seeds:
            ga, gb = a_games.get(s), b_games.get(s)
            if not ga or not gb or len(ga) != len(gb):
                per_game = []
                break
            per_game.append(np.asarray(ga, dtype=np.float64) - np.asarray(gb, dtype=np.float64))
    if per_game:
        ci = hierarchical_bootstrap_ci(per_game, confidence=confidence, n_resamples=n_resamples, seed=seed)
        method = "seeds, then games"
        sizes = {len(g) for g in per_game}
        games = sizes.pop() if len(sizes) == 1 else None
    else:
        ci = seed_bootstrap_ci(diffs, confidence=confidence, n_resamples=n_resamples, seed=seed)
        method = "seeds"
    return PairedComparison(a=names[0], b=names[1], metric=metric, seeds=tuple(seeds), diffs=tuple(diffs),
                            mean=mean, std=std, p=p, p_exact=exact, p_min=min_sign_flip_pvalue(len(seeds)), ci=ci,
                            confidence=confidence, ci_method=method, games=games, alpha=alpha)


# -- text ------------------------------------------------------------------------------------------------------
def format_p(p: float | None) -> str:
    """A p-value as text: three decimals, four below 0.01 (2/256 → 0.0078); "–" for None."""
    if p is None:
        return "–"
    return f"{p:.3f}" if p >= 0.01 else f"{p:.4f}"


def format_ci(ci: tuple[float, float] | list[float] | None, digits: int = 3) -> str:
    if ci is None:
        return "–"
    return f"[{ci[0]:+.{digits}f}, {ci[1]:+.{digits}f}]"


def format_mean_std(c: PairedComparison | Mapping[str, Any], digits: int = 3) -> str:
    mean, std = (c["mean"], c["std"]) if isinstance(c, Mapping) else (c.mean, c.std)
    if mean is None:
        return "–"
    return f"{mean:+.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")


def _get(c: PairedComparison | Mapping[str, Any], key: str) -> Any:
    return c[key] if isinstance(c, Mapping) else getattr(c, key)


def summary_line(c: PairedComparison | Mapping[str, Any], digits: int = 3) -> str:
    """One line: ``a − b (metric), n=3: +0.271 ± 0.321; p = 0.500 (exact sign-flip; smallest possible 0.250);
    95% CI [+0.000, +0.625] (bootstrap over seeds, then games): not separated``. Takes a
    :class:`PairedComparison` or its ``to_dict()``."""
    if not _get(c, "seeds"):
        return f"{_get(c, 'a')} − {_get(c, 'b')} ({_get(c, 'metric')}): no paired seeds"
    exact = "exact sign-flip" if _get(c, "p_exact") else "sign-flip, sampled"
    return (f"{_get(c, 'a')} − {_get(c, 'b')} ({_get(c, 'metric')}), n={len(_get(c, 'seeds'))}: "
            f"{format_mean_std(c, digits)}; p = {format_p(_get(c, 'p'))} ({exact}; smallest possible "
            f"{format_p(_get(c, 'p_min'))}); {_get(c, 'confidence'):.0%} CI {format_ci(_get(c, 'ci'), digits)} "
            f"(bootstrap over {_get(c, 'ci_method')}): "
            f"{'separated' if _get(c, 'p') is not None and _get(c, 'p') < _get(c, 'alpha') else 'not separated'}")


TABLE_HEAD = ("| comparison | n | per-seed differences | mean ± std | p (exact sign-flip) | smallest possible p | "
              "95% CI (bootstrap) | verdict |")


TABLE_NOTE = ("Paired by seed (same task groups, same held-out games). p: two-sided exact sign-flip permutation test "
              "over seeds (all 2^n sign assignments); with n seeds it cannot go below 2/2^n (the smallest possible "
              "p). 95% CI: percentile bootstrap of the mean difference, 10,000 resamples of the seeds and then, "
              "within each seed, of its held-out games (seeds only where no per-game score is stored); with few "
              "seeds it is too narrow (a seeds-only interval never leaves the range of the observed per-seed "
              "differences), so the verdict goes by p: \"separated\" only at p < 0.05.")


def table_cells(c: PairedComparison | Mapping[str, Any], digits: int = 3, metric: bool = False) -> list[str]:
    """One comparison's cells under :data:`TABLE_HEAD` (a Markdown table's row, the report page's): the pair (and
    its metric with ``metric``), n, the per-seed differences, mean ± std, p (``(sampled)`` when not exact), the
    smallest possible p, the CI and how it was resampled, the verdict."""
    seeds, diffs = _get(c, "seeds"), _get(c, "diffs")
    per = ", ".join(f"s{s} {d:+.{digits}f}" for s, d in zip(seeds, diffs)) or "–"
    p = _get(c, "p")
    verdict = "separated" if p is not None and p < _get(c, "alpha") else "not separated"
    how = "seeds, games" if _get(c, "ci_method") == "seeds, then games" else "seeds"
    what = f", {_get(c, 'metric')}" if metric else ""
    return [f"{_get(c, 'a')} − {_get(c, 'b')}{what}", str(len(seeds)), per, format_mean_std(c, digits),
            f"{format_p(p)}{'' if _get(c, 'p_exact') or p is None else ' (sampled)'}", format_p(_get(c, "p_min")),
            f"{format_ci(_get(c, 'ci'), digits)} ({how})", verdict]


def markdown_table(comparisons: Sequence[PairedComparison | Mapping[str, Any]], digits: int = 3,
                   note: bool = True) -> str:
    """The comparisons as a Markdown table (one row each), with a note on how each figure is computed; the
    metric follows the pair's names where the rows compare more than one."""
    lines = [TABLE_HEAD, "|---|---:|---|---:|---:|---:|---:|---|"]
    several = len({_get(c, "metric") for c in comparisons}) > 1
    lines += ["| " + " | ".join(table_cells(c, digits, several)) + " |" for c in comparisons]
    if note:
        lines += ["", TABLE_NOTE]
    return "\n".join(lines) + "\n"
