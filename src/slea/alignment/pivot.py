"""Choosing tlm-DRE's pivot: the histogram of per-turn adequacy on the failure set (T-paper Fig. 5) and a
suggested ``p_pivot``.

The paper reads 0.9 off its histogram by eye. :func:`suggest_pivot` makes the choice reproducible: it splits
the histogram where the two sides are best separated (Otsu 1979, the threshold that maximises the
between-class variance of the binned values), which on a histogram with a confident mode near 1 and a spread of
uncertain turns lands in the valley between them. The plot marks the suggestion and the paper's 0.9, so the
user sees both before setting the pivot.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slea.algorithms.alignment import turn_adequacy
from slea.atomic import atomic_write_bytes

__all__ = ["PAPER_PIVOT", "PivotReport", "adequacy_histogram", "plot_adequacy", "suggest_pivot"]

PAPER_PIVOT = 0.9  # T-paper §5 / App. C


def suggest_pivot(p: np.ndarray, bins: int = 50, default: float = PAPER_PIVOT) -> float:
    """Otsu's threshold on the histogram of ``p`` over ``[0, 1]`` in ``bins`` bins, as a bin edge.

    Turns at or below the returned value form one class (uncertain, ω_U under Eq.10), those above the other.
    When several splits are equally good (an empty stretch between two modes) the middle of that stretch is
    returned (the lower of two middles). With fewer than two occupied bins there is nothing to split: ``default`` (the paper's 0.9).
    An empty ``p`` or a value outside ``[0, 1]`` is a ``ValueError``.
    """
    p = np.asarray(p, dtype=np.float64).ravel()
    if p.size == 0:
        raise ValueError("no turns: the adequacy histogram is empty")
    if np.any((p < 0) | (p > 1)) or not np.all(np.isfinite(p)):
        raise ValueError("turn adequacy must lie in [0, 1] (Eq.9 gives exp of a mean log-prob)")
    hist, edges = np.histogram(p, bins=bins, range=(0.0, 1.0))
    if np.count_nonzero(hist) < 2:
        return float(default)
    w = hist / hist.sum()
    centers = (edges[:-1] + edges[1:]) / 2
    below = np.cumsum(w)[:-1]  # class 0 = bins 0..k, for a split after bin k
    mu_below = np.cumsum(w * centers)[:-1]
    mu_all = float((w * centers).sum())
    with np.errstate(divide="ignore", invalid="ignore"):
        between = (mu_all * below - mu_below) ** 2 / (below * (1 - below))
    between = np.where((below > 0) & (below < 1), between, -np.inf)
    best = np.flatnonzero(between >= between.max() * (1 - 1e-12))
    k = int((best[0] + best[-1]) // 2)
    return float(edges[k + 1])


@dataclass(frozen=True)
class PivotReport:
    """What the pivot helper found: the suggested pivot and how it splits the turns."""

    pivot: float
    n_turns: int
    frac_confident: float  # turns with p > pivot (weight ω_L)
    frac_confident_at_paper_pivot: float  # turns with p > 0.9
    path: str


def plot_adequacy(p: np.ndarray, path: str | Path, pivot: float, *, bins: int = 50,
                  title: str = "per-turn adequacy on the failure set") -> Path:
    """Write the histogram of ``p`` (Eq.9) as a PNG, with ``pivot`` and the paper's 0.9 marked."""
    from matplotlib.figure import Figure  # no pyplot: no global backend state; PNG output uses Agg

    fig = Figure(figsize=(6.4, 3.6))
    ax = fig.subplots()
    ax.hist(np.asarray(p, dtype=np.float64), bins=bins, range=(0.0, 1.0), color="tab:blue", alpha=0.8)
    ax.axvline(pivot, color="tab:red", linestyle="--", label=f"suggested pivot {pivot:.2f}")
    if abs(pivot - PAPER_PIVOT) > 1e-9:
        ax.axvline(PAPER_PIVOT, color="tab:gray", linestyle=":", label=f"paper {PAPER_PIVOT}")
    ax.set_xlabel("p_i = exp(mean token log-prob under π_ref)  (tlm-DRE Eq.9)")
    ax.set_ylabel("turns")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    path = Path(path)
    atomic_write_bytes(path, buf.getvalue())
    return path


def adequacy_histogram(turn_logprobs: Sequence[np.ndarray], path: str | Path, *, bins: int = 50) -> PivotReport:
    """From each failed turn's reference token log-probs: Eq.9 adequacy, the suggested pivot, the PNG at ``path``."""
    p = turn_adequacy(turn_logprobs)
    pivot = suggest_pivot(p, bins)
    out = plot_adequacy(p, path, pivot, bins=bins)
    return PivotReport(pivot, int(p.size), float(np.mean(p > pivot)), float(np.mean(p > PAPER_PIVOT)), str(out))
