"""Entropy and the covariance-based losses (slea/algorithms/entropy.py) against hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from slea.algorithms.entropy import clip_cov, kl_cov, token_covariance, token_entropy
from slea.algorithms.losses import ppo_clip
from slea.algorithms.registry import get_policy_loss
from slea.config import AlgorithmSection, loss_settings

LOGP = [[-1.0, -2.0], [-3.0, -4.0]]
ADV = [[2.0, 1.0], [-1.0, -1.0]]
# mean log π = −2.5, mean A = 0.25: Cov = (logπ + 2.5)(A − 0.25)
COV = [[1.5 * 1.75, 0.5 * 0.75], [-0.5 * -1.25, -1.5 * -1.25]]  # 2.625, 0.375 / 0.625, 1.875


def test_token_entropy_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25], [1 / 3, 1 / 3, 1 / 3]]))
    assert token_entropy(logits).tolist() == pytest.approx([1.5 * math.log(2), math.log(3)], rel=1e-6)
    assert token_entropy(torch.tensor([[0.0, float("-inf")]])).tolist() == [0.0]  # a certain token: 0, not NaN
    assert token_entropy(torch.tensor([[3.0, 3.0]])).tolist() == pytest.approx([math.log(2)])  # shift-invariant


def test_token_covariance_by_hand_and_masked():
    cov = token_covariance(torch.tensor(LOGP), torch.tensor(ADV), torch.ones(2, 2))
    assert cov.flatten().tolist() == pytest.approx([x for row in COV for x in row])
    # without token (1, 1): means over the other three, −2 and 2/3
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    cov = token_covariance(torch.tensor(LOGP), torch.tensor(ADV), mask)
    assert cov.flatten().tolist() == pytest.approx([1 * (2 - 2 / 3), 0.0, -1 * (-1 - 2 / 3), 0.0])


def _leaf(values):
    return torch.tensor(values, requires_grad=True)


@pytest.mark.parametrize("ratio, penalised", [(0.25, [(0, 0)]), (0.5, [(0, 0), (1, 1)])])
def test_kl_cov_loss_by_hand(ratio, penalised):
    """Top ⌊ratio·4⌋ tokens by Cov ((0,0) then (1,1)) get β|log ρ|; every token −A·ρ, no clip."""
    shift = [[0.1, 0.0], [0.0, -0.2]]  # log ρ per token
    logp = _leaf(LOGP)
    old = torch.tensor(LOGP) - torch.tensor(shift)
    loss, met = kl_cov(logp, old, torch.tensor(ADV), torch.ones(2, 2), kl_cov_ratio=ratio, ppo_kl_coef=1.0)
    terms = [-ADV[i][j] * math.exp(shift[i][j]) + (abs(shift[i][j]) if (i, j) in penalised else 0.0)
             for i in range(2) for j in range(2)]
    assert float(loss.detach()) == pytest.approx(sum(terms) / 4, rel=1e-6)
    assert met["cov_kl_frac"] == len(penalised) / 4
    assert met["clip_frac"] == 0.0


def test_clip_cov_detaches_one_eligible_token_at_random_and_keeps_the_rest():
    """Cov in (1, 5): tokens (0,0) 2.625 and (1,1) 1.875; ⌊2e-4·4⌋ → at least 1 is detached. Its gradient is 0;
    every other token's gradient is the unclipped −A·ρ / 4 (token-mean)."""
    shift = [[0.1, 0.0], [0.0, -0.1]]  # no token is clipped by PPO at ε = 0.2
    chosen = set()
    for seed in range(12):
        torch.manual_seed(seed)
        logp = _leaf(LOGP)
        loss, met = clip_cov(logp, torch.tensor(LOGP) - torch.tensor(shift), torch.tensor(ADV), torch.ones(2, 2))
        loss.backward()
        zero = {(i, j) for i in range(2) for j in range(2) if logp.grad[i, j] == 0}
        assert len(zero) == 1 and zero <= {(0, 0), (1, 1)}
        chosen |= zero
        for i in range(2):
            for j in range(2):
                if (i, j) not in zero:
                    want = -ADV[i][j] * math.exp(shift[i][j]) / 4
                    assert float(logp.grad[i, j]) == pytest.approx(want, rel=1e-6)
        assert met["cov_clip_frac"] == 0.25
    assert chosen == {(0, 0), (1, 1)}  # the choice is random between the eligible ones


def test_clip_cov_never_picks_a_token_ppo_already_clipped_and_equals_ppo_clip_without_candidates():
    shift = [[0.5, 0.0], [0.0, -0.1]]  # (0,0): ρ = 1.65, A > 0: PPO-clipped, so (1,1) is the only candidate
    logp = _leaf(LOGP)
    loss, _ = clip_cov(logp, torch.tensor(LOGP) - torch.tensor(shift), torch.tensor(ADV), torch.ones(2, 2))
    loss.backward()
    assert logp.grad[1, 1] == 0 and logp.grad[0, 1] != 0
    old = torch.tensor(LOGP) - torch.tensor(shift)
    none, _ = clip_cov(torch.tensor(LOGP), old, torch.tensor(ADV), torch.ones(2, 2), clip_cov_lb=10.0,
                       clip_cov_ub=20.0)
    ref, _ = ppo_clip(torch.tensor(LOGP), old, torch.tensor(ADV), torch.ones(2, 2))
    assert float(none) == pytest.approx(float(ref), rel=1e-7)


def test_the_covariance_losses_are_registered_and_take_their_settings_from_the_config():
    assert get_policy_loss("clip_cov") is clip_cov and get_policy_loss("kl_cov") is kl_cov
    algo = AlgorithmSection(policy_loss="clip_cov", clip_eps=0.2, clip_eps_high=0.28,
                            options={"clip_cov_ratio": 1e-3, "clip_cov_ub": 4.0})
    assert loss_settings(algo, clip_cov) == {"clip_ratio": 0.2, "clip_ratio_high": 0.28, "clip_cov_ratio": 1e-3,
                                             "clip_cov_ub": 4.0, "loss_agg_mode": "token-mean"}
    kl = AlgorithmSection(policy_loss="kl_cov", options={"kl_cov_ratio": 2e-3})
    assert loss_settings(kl, kl_cov) == {"kl_cov_ratio": 2e-3, "loss_agg_mode": "token-mean"}
