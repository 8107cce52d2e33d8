"""Token-level and turn-level GAE against hand-unrolled recursions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from slea.algorithms import token_gae, turn_gae, whiten
from slea.algorithms.gae import gae

approx = pytest.approx

# gamma .9, lam .8 (γλ = .72), rewards [0, 0, 1], values [.5, .6, .7]:
#   δ2 = 1 - .7 = .3                  A2 = .3
#   δ1 = .9·.7 - .6 = .03             A1 = .03 + .72·.3 = .246
#   δ0 = .9·.6 - .5 = .04             A0 = .04 + .72·.246 = .21712
#   returns = A + V = [.71712, .846, 1.0]
A_HAND = [0.21712, 0.246, 0.3]
RET_HAND = [0.71712, 0.846, 1.0]


def test_token_gae_hand_unrolled():
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    v = torch.tensor([[0.5, 0.6, 0.7], [1.0, 1.0, 1.0]], dtype=torch.float64)
    m = torch.ones(2, 3)
    a, ret = gae(r, v, m, gamma=0.9, lam=0.8)
    assert a[0].tolist() == approx(A_HAND)
    assert ret[0].tolist() == approx(RET_HAND)
    # second row: δ = [-.1, -.1, -1]; A2 = -1, A1 = -.1 - .72 = -.82, A0 = -.1 - .72·.82 = -.6904
    assert a[1].tolist() == approx([-0.6904, -0.82, -1.0])


def test_token_gae_skips_masked_positions():
    # an observation token (mask 0) between response tokens is passed through; a padded tail bootstraps 0
    r = torch.tensor([[0.0, 9.0, 0.0, 1.0, 5.0]], dtype=torch.float64)
    v = torch.tensor([[0.5, 99.0, 0.6, 0.7, 9.0]], dtype=torch.float64)
    m = torch.tensor([[1, 0, 1, 1, 0]])
    a, ret = gae(r, v, m, gamma=0.9, lam=0.8)
    assert a[0].tolist() == approx([A_HAND[0], 0.0, A_HAND[1], A_HAND[2], 0.0])
    assert ret[0].tolist() == approx([RET_HAND[0], 0.0, RET_HAND[1], RET_HAND[2], 0.0])


def test_token_gae_numpy_in_numpy_out_and_lambda_one():
    r = np.array([[0.0, 0.0, 1.0]])
    v = np.array([[0.5, 0.6, 0.7]])
    a, ret = gae(r, v, np.ones((1, 3)), gamma=0.9, lam=1.0)
    assert isinstance(a, np.ndarray) and isinstance(ret, np.ndarray)
    # λ = 1: A = discounted return - V = [.81 - .5, .9 - .6, 1 - .7]
    assert a[0].tolist() == approx([0.31, 0.3, 0.3])
    assert ret[0].tolist() == approx([0.81, 0.9, 1.0])


def test_package_exports():
    assert token_gae is gae


def test_whiten_one_helper():
    # mean 2, unbiased std 1; one value or all equal give exactly 0
    assert whiten(np.array([1.0, 2.0, 3.0]), eps=0.0).tolist() == approx([-1.0, 0.0, 1.0])
    assert whiten(np.array([5.0])).tolist() == [0.0]
    assert whiten(np.array([4.0, 4.0, 4.0])).tolist() == [0.0, 0.0, 0.0]
    assert whiten(np.array([1.0, 3.0]), std_norm=False).tolist() == [-1.0, 1.0]


def test_turn_gae_hand_unrolled_and_row_order():
    # trajectory 3 given out of order (steps 2, 0, 1) and trajectory 8 (one turn: δ = 2 - 1.5 = .5)
    traj = [3, 8, 3, 3]
    steps = [2, 0, 0, 1]
    rewards = [1.0, 2.0, 0.0, 0.0]
    values = [0.7, 1.5, 0.5, 0.6]
    a, ret = turn_gae(traj, steps, rewards, values, gamma=0.9, lam=0.8)
    assert a.tolist() == approx([A_HAND[2], 0.5, A_HAND[0], A_HAND[1]])
    assert ret.tolist() == approx([RET_HAND[2], 2.0, RET_HAND[0], RET_HAND[1]])
    a1, _ = turn_gae(traj, steps, rewards, values, gamma=0.9, lam=1.0)
    assert a1.tolist() == approx([0.3, 0.5, 0.31, 0.3])


def test_turn_gae_randomized_against_loop():
    rng = np.random.default_rng(3)
    traj = np.repeat(np.arange(30), rng.integers(1, 12, 30))
    steps = np.concatenate([rng.permutation(np.sum(traj == k)) for k in range(30)])
    r = rng.normal(size=len(traj))
    v = rng.normal(size=len(traj))
    perm = rng.permutation(len(traj))
    traj, steps, r, v = traj[perm], steps[perm], r[perm], v[perm]
    a, ret = turn_gae(traj, steps, r, v, gamma=0.97, lam=0.9)
    want = np.zeros(len(traj))
    for k in range(30):
        idx = sorted(np.flatnonzero(traj == k), key=lambda i: steps[i])
        last = 0.0
        for p in range(len(idx) - 1, -1, -1):
            i = idx[p]
            nv = v[idx[p + 1]] if p + 1 < len(idx) else 0.0
            last = r[i] + 0.97 * nv - v[i] + 0.97 * 0.9 * last
            want[i] = last
    np.testing.assert_allclose(a, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ret, want + v, rtol=1e-12, atol=1e-12)
