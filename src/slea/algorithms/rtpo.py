"""RTPO: Reverse-Turn Policy Optimization (Li, Cao, Qiao, Hu 2026, arXiv 2608.18682), the advantage side.

RTPO trains an episode's turns in reverse order. A trunk trajectory records every turn boundary (the env
snapshot and the exact prompt ``c_k = ψ(S_k)``); for ``k = K−1 … 0``, ``G−1`` siblings fork from boundary ``k``
with the latest weights, play on to the end, and only their turn-``k`` tokens are updated (the trunk is not
trained). The rollout side lives in :mod:`slea.rollout.schemes` (``SiblingRollouts``); this module holds the
equations, each a pure function, and the registered estimator.

A step batch of one reverse step holds the siblings' rows from their fork turn on: a trajectory's first row
(lowest ``steps``) is the forked turn ``k``; siblings forked from the same boundary share a ``group_id``.
"""

from __future__ import annotations

import numpy as np

from slea.algorithms.batch import Advantages, StepBatch
from slea.algorithms.registry import register_algorithm

__all__ = ["fork_rows", "rtpo", "sibling_advantages", "sibling_returns"]


def fork_rows(batch: StepBatch) -> np.ndarray:
    """The row index of each trajectory's forked turn (its first row in ``steps`` order), by trajectory code:
    the rows Eq.6 trains on (RTPO §3.2: "update the turn-k tokens alone")."""
    idx = batch.rows
    rows: np.ndarray = idx.order[idx.starts]
    return rows


def sibling_returns(batch: StepBatch, gamma: float) -> np.ndarray:
    """Per trajectory (by code), the sibling's return from its forked turn ``k`` on (RTPO Eq.7-8, MAXQ
    decomposition ``Q̂_{j,k} = r_{j,k} + γ^{τ_k} F̂_{j,k}``): ``R_j = Σ_{t≥k} γ^{t−k} r_{j,t}``, with the
    invalid-action penalties folded into the rewards (turns count rows; the paper uses ``γ = 1``)."""
    per_row = batch.rows.reverse_scan(batch.folded_rewards, float(gamma))
    returns: np.ndarray = per_row[fork_rows(batch)]
    return returns


def sibling_advantages(returns: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """RTPO Eq.6's state-matched advantage ``A^H_{j,k} = R_j − V̂_k`` with ``V̂_k = (1/(G−1)) Σ_j R_j``, the mean
    over the siblings forked from the same boundary (``groups``: one code, or one row of codes, per sibling); no
    std normalisation.
    A boundary with one sibling gets 0; equal returns give exactly 0 (shifted by a member before averaging)."""
    returns = np.asarray(returns, dtype=np.float64)
    g = np.asarray(groups)
    codes, inverse = np.unique(g, axis=0 if g.ndim == 2 else None, return_inverse=True)
    groups = inverse.reshape(-1)
    m = len(codes)
    ref = np.zeros(m)
    ref[groups[::-1]] = returns[::-1]  # some member of each group: its first
    x = returns - ref[groups]
    mean = np.bincount(groups, x, minlength=m) / np.bincount(groups, minlength=m)
    return x - mean[groups]


@register_algorithm("rtpo", level="turn", needs=("snapshots",),
                    defaults={"algorithm.gamma": 1.0, "algorithm.loss_agg": "seq-mean-token-mean",
                              "algorithm.skip_zero_advantage": False})
def rtpo(batch: StepBatch, *, gamma: float) -> Advantages:
    """RTPO (Li et al. 2026, Eq.6-8): ``R_j − mean_j R_j`` over the siblings forked at one boundary, on the forked
    turn's row alone (``Advantages.train`` masks the later turns out; their rewards only enter ``R_j``).

    Defaults as printed: ``γ = 1``; sequence-normalised per sibling then averaged over siblings
    (``loss_agg: seq-mean-token-mean``); zero-advantage siblings stay in Eq.6's ``1/(G−1)`` mean."""
    first = fork_rows(batch)
    boundary = np.stack([batch.rows.traj_group, batch.steps[first]], axis=1)  # (group, fork turn)
    adv = sibling_advantages(sibling_returns(batch, gamma), boundary)
    rows = np.zeros(batch.n)
    rows[first] = adv
    train = np.zeros(batch.n, dtype=bool)
    train[first] = True
    return Advantages(rows, train=train)
