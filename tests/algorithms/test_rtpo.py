"""RTPO's advantage (Li et al. 2026, Eq.6-8) on hand-computed cases, and its registration."""

from __future__ import annotations

import numpy as np
import pytest

from slea.algorithms.batch import StepBatch, estimate
from slea.algorithms.registry import get_algorithm
from slea.algorithms.rtpo import sibling_advantages


def _batch(rows, penalties=None):
    """rows: (group, traj, step, reward)."""
    g, t, s, r = (np.array(c) for c in zip(*rows))
    return StepBatch(g, t, s, r.astype(float), penalties=None if penalties is None else np.array(penalties, float))


def test_sibling_advantages_are_return_minus_the_boundary_mean_without_std():
    # boundary A: returns 1, 0, 0, 1 -> mean 0.5 -> +0.5, -0.5, -0.5, +0.5 (a std division would give ±0.866)
    # boundary B: 0.2 and 0.8 -> mean 0.5 -> -0.3, +0.3; boundary C: one sibling -> 0
    adv = sibling_advantages(np.array([1, 0, 0, 1, 0.2, 0.8, 7.0]), np.array([0, 0, 0, 0, 1, 1, 2]))
    np.testing.assert_allclose(adv, [0.5, -0.5, -0.5, 0.5, -0.3, 0.3, 0.0])
    equal = sibling_advantages(np.full(3, 0.1), np.zeros(3, int))
    assert np.array_equal(equal, np.zeros(3))  # equal returns: exactly 0, no rounding residue


def test_rtpo_estimator_hand_case_turn_k_only():
    """Three siblings forked at turn 1 of one trunk (group 0), γ = 0.5, rows shuffled:
    traj 10: turns 1, 2 with rewards 0, 1   -> R = 0 + 0.5·1   = 0.5
    traj 11: turn 1 with reward 0           -> R = 0
    traj 12: turns 1, 2, 3 with 0, 0, 1     -> R = 0.5²·1      = 0.25
    mean 0.25 -> A = +0.25, -0.25, 0 on the turn-1 rows; the later rows get 0 and are not trained.
    A second trunk's single sibling (group 1, forked at turn 1) gets 0."""
    rows = [(0, 12, 3, 1.0), (0, 10, 1, 0.0), (0, 11, 1, 0.0), (0, 12, 1, 0.0), (0, 10, 2, 1.0), (0, 12, 2, 0.0),
            (1, 20, 1, 1.0)]
    spec = get_algorithm("rtpo")
    adv = estimate(spec, _batch(rows), {"gamma": 0.5})
    np.testing.assert_allclose(adv.rows, [0, 0.25, -0.25, 0, 0, 0, 0])
    assert adv.train.tolist() == [False, True, True, True, False, False, True]  # the forked turn of each sibling


def test_rtpo_counts_penalties_in_the_sibling_return():
    # penalty 0.1 on traj 1's forked turn, kept apart in the batch: R = (0, -0.1) -> mean -0.05 -> (+0.05, -0.05)
    rows = [(0, 0, 2, 0.0), (0, 1, 2, 0.0)]
    adv = estimate(get_algorithm("rtpo"), _batch(rows, penalties=[0.0, 0.1]), {"gamma": 1.0})
    np.testing.assert_allclose(adv.rows, [0.05, -0.05])


def test_rtpo_spec_needs_snapshots_and_defaults_as_printed():
    spec = get_algorithm("rtpo")
    assert spec.needs == frozenset({"snapshots"}) and spec.level == "turn" and spec.settings == ("gamma",)
    assert spec.defaults == {"algorithm.gamma": 1.0, "algorithm.loss_agg": "seq-mean-token-mean",
                             "algorithm.skip_zero_advantage": False}


def test_a_wrong_sized_train_mask_is_refused():
    from slea.algorithms.batch import Advantages
    from slea.algorithms.registry import AlgorithmSpec

    spec = AlgorithmSpec("bad", lambda b: Advantages(np.zeros(b.n), train=np.ones(b.n + 1, bool)), "turn")
    with pytest.raises(ValueError, match="train mask"):
        estimate(spec, _batch([(0, 0, 0, 1.0)]), {})
