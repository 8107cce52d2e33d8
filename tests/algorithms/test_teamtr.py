"""TeamTR's equations (Eq.9, Eq.10, Eq.11) and the adaptive-β rule against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from slea.algorithms import StepBatch, estimate, get_algorithm, get_policy_loss
from slea.algorithms.teamtr import adapt_beta, team_advantage, teamtr_surrogate, token_kl

approx = pytest.approx
LN = math.log


# -- Eq.9 ---------------------------------------------------------------------------------------------------
def test_team_advantage_hand_computed():
    # groups interleaved, results must come back in input order
    gid = [0, 1, 0, 2, 0, 1, 0, 2]
    ret = [1.0, 2.0, 0.0, 0.5, 0.0, 2.0, 0.0, -0.5]
    # group 0: R = [1, 0, 0, 0], μ = .25, R − μ = [.75, −.25, −.25, −.25],
    #   (1/G) Σ (R − μ)² = (.5625 + 3·.0625)/4 = .1875;  σ = sqrt(.1875 + .0625) = .5
    #   → [1.5, −.5, −.5, −.5]
    # group 1: R = [2, 2] → exactly 0
    # group 2: R = [.5, −.5], μ = 0, var = .25, σ = sqrt(.25 + .0625) = sqrt(.3125) = .5590170,
    #   → ±.5/.5590170 = ±.8944272
    out = team_advantage(ret, gid, a_clip=10.0, eps_norm=0.0625)
    assert out.tolist() == approx([1.5, 0.0, -0.5, 0.8944272, -0.5, 0.0, -0.5, -0.8944272], abs=1e-6)
    assert out[[1, 5]].tolist() == [0.0, 0.0]  # all-equal group: exactly 0, no rounding residue
    # clipped to ±A_clip = 1: the 1.5 becomes 1, nothing else moves
    clipped = team_advantage(ret, gid, a_clip=1.0, eps_norm=0.0625)
    assert clipped.tolist() == approx([1.0, 0.0, -0.5, 0.8944272, -0.5, 0.0, -0.5, -0.8944272], abs=1e-6)


def test_team_advantage_uses_population_variance_not_unbiased():
    # R = [1, −1]: μ = 0, population var = 1 (unbiased would be 2); ε 0 → σ = 1 → [1, −1]
    assert team_advantage([1.0, -1.0], [7, 7], a_clip=5.0, eps_norm=0.0).tolist() == approx([1.0, -1.0])
    assert team_advantage([], [], a_clip=1.0, eps_norm=0.0).shape == (0,)
    with pytest.raises(ValueError, match="a_clip"):
        team_advantage([1.0], [0], a_clip=0.0, eps_norm=0.0)


def test_registered_estimator_broadcasts_eq9_to_every_message():
    spec = get_algorithm("teamtr")
    assert spec.needs == {"team"} and spec.level == "trajectory"
    assert spec.defaults["algorithm.policy_loss"] == "teamtr"
    # Eq.10's E_m runs over all of the agent's messages: a zero advantage still counts in the surrogate's mean
    assert spec.defaults["algorithm.skip_zero_advantage"] is False
    # one group, two rollouts: τ0 has 3 messages with rewards [0, 0, 1], τ1 has 2 messages with [0, −0.2]
    # returns [1, −.2]: μ = .4, dev ±.6, var .36, ε 0 → σ .6 → Ã = [1, −1] on every message
    batch = StepBatch([0] * 5, [0, 0, 0, 1, 1], [0, 1, 2, 0, 1], [0.0, 0.0, 1.0, 0.0, -0.2])
    adv = estimate(spec, batch, {"a_clip": 5.0, "eps_norm": 0.0})
    assert adv.rows.tolist() == approx([1.0, 1.0, 1.0, -1.0, -1.0])


# -- Eq.11 --------------------------------------------------------------------------------------------------
def test_token_kl_hand_computed():
    # message 0: tokens (cur, new) = (−1, −1.5), (−2, −1): (−1 + 1.5) + (−2 + 1) = .5 − 1 = −.5
    # message 1: (−.5, −1.5): 1.0;  row 2 has no token: not a message. Padding holds junk (9) on purpose.
    cur = torch.tensor([[-1.0, -2.0, 9.0], [-0.5, 9.0, 9.0], [9.0, 9.0, 9.0]])
    new = torch.tensor([[-1.5, -1.0, 0.0], [-1.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert token_kl(cur, new, mask, "k1").item() == approx((-0.5 + 1.0) / 2)  # .25
    # numpy arrays work the same
    assert float(token_kl(cur.numpy(), new.numpy(), mask.numpy(), "k1")) == approx(0.25)
    assert token_kl(cur, new, torch.zeros_like(mask), "k1").item() == 0.0
    # k3: Σ_u (r − 1) − log r, log r = new − cur: message 0: log r = −.5, 1 → (e^−.5 − 1 + .5) + (e − 1 − 1)
    #   = .1065307 + .7182818 = .8248125;  message 1: log r = −1 → e^−1 − 1 + 1 = .3678794;  mean .5963460
    assert token_kl(cur, new, mask, "k3").item() == approx(0.5963460, abs=1e-6)
    assert token_kl(cur, new, mask).item() == approx(0.5963460, abs=1e-6)  # k3 is the default
    with pytest.raises(ValueError, match="k1, k3"):
        token_kl(cur, new, mask, "k2")


def test_k3_is_never_negative_where_k1_is():
    # a step that raised the likelihood of the messages it is measured on: every log-ratio new − cur > 0, so k1
    # (Σ cur − new) is negative, while k3 = Σ e^{log r} − 1 − log r is positive (e^x ≥ 1 + x, equality only at 0)
    cur = torch.tensor([[-2.0, -1.0], [-3.0, -0.5]])
    new = cur + torch.tensor([[0.3, 0.1], [0.2, 0.0]])
    mask = torch.ones(2, 2)
    # k1: (−.3 − .1 + −.2 − 0)/2 = −.3;  k3: (e^.3 − 1.3) + (e^.1 − 1.1) + (e^.2 − 1.2) + 0, over 2 messages
    #   = (.0498588 + .0051709 + .0214028)/2 = .0382162
    assert token_kl(cur, new, mask, "k1").item() == approx(-0.3, abs=1e-6)
    assert token_kl(cur, new, mask, "k3").item() == approx(0.0382162, abs=1e-6)
    assert token_kl(cur, cur.clone(), mask, "k3").item() == 0.0  # exactly 0 where nothing moved
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):  # random per-token log-probs, messages of 1-6 tokens, shifts of either sign
        cur = -torch.rand(8, 6, generator=gen) * 5
        new = cur + torch.randn(8, 6, generator=gen) * torch.rand(1, generator=gen) * 3
        mask = (torch.arange(6) < torch.randint(1, 7, (8, 1), generator=gen)).float()
        assert token_kl(cur, new, mask, "k3").item() >= 0.0


# -- Eq.10 --------------------------------------------------------------------------------------------------
def _two_messages():
    # message 0: token ratios 2 and .75 → w = 1.5 (per-token clipping would treat them separately)
    # message 1: one token, ratio .5 → w = .5
    cur = torch.zeros(2, 2, dtype=torch.float64)
    new = torch.tensor([[LN(2.0), LN(0.75)], [0.0, LN(0.5)]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [0.0, 1.0]], dtype=torch.float64)
    return cur, new, mask


def test_surrogate_message_ratio_clip_and_kl_penalty_hand_computed():
    cur, new, mask = _two_messages()
    adv = torch.tensor([1.0, 2.0], dtype=torch.float64)
    s = teamtr_surrogate(new, cur, adv, mask, clip_eps=0.1, beta=0.5, kl_estimator="k1")
    assert s.ratio.tolist() == approx([1.5, 0.5])
    # min(w·Ã, clip(w, .9, 1.1)·Ã): msg 0 min(1.5, 1.1) = 1.1 (clipped); msg 1 min(1.0, 1.8) = 1.0
    assert s.clipped.item() == approx((1.1 + 1.0) / 2)
    # d̂ = mean(Σ cur − new) = (−ln 1.5 + ln 2)/2 = (−.4054651 + .6931472)/2 = .1438410
    assert s.kl.item() == approx(0.1438410, abs=1e-6)
    assert s.objective.item() == approx(1.05 - 0.5 * 0.1438410, abs=1e-6)
    assert s.clip_frac == approx(0.5)
    (-s.objective).backward()
    # −L = −clipped + β·d̂.  d d̂/d log π_new = −1/2 per token (two messages), so the KL term adds β·(−1/2) = −.25.
    # msg 0: clipped branch active → no surrogate gradient: −.25 per token.
    # msg 1: −(1/2)·Ã·w = −(.5·2·.5) = −.5, plus −.25 → −.75 (its masked column gets 0)
    assert new.grad.flatten().tolist() == approx([-0.25, -0.25, 0.0, -0.75])


def test_surrogate_is_pessimistic_for_negative_advantages_and_the_loss_is_registered():
    cur, new, mask = _two_messages()
    # Ã = −1 with w = 1.5: min(−1.5, −1.1) = −1.5 (unclipped); w = .5: min(−.5, −.9) = −.9 (clipped)
    adv_tokens = torch.tensor([[-1.0, -1.0], [0.0, -1.0]], dtype=torch.float64)  # per-token broadcast form
    loss, met = get_policy_loss("teamtr")(new, cur, adv_tokens, mask, clip_ratio=0.1, beta=0.0, kl_estimator="k1")
    assert loss.item() == approx(-(-1.5 - 0.9) / 2)
    assert met["clip_frac"] == approx(0.5)
    assert met["ratio_mean"] == approx(1.0) and met["ratio_max_dev"] == approx(0.5)
    assert met["token_kl"] == approx(0.1438410, abs=1e-6)


# -- the adaptive-β rule ------------------------------------------------------------------------------------
RULE = {"min_steps": 2, "max_steps": 5, "factor": 2.0, "beta_min": 1e-3, "beta_max": 1.0}


def test_adapt_beta_hand_cases():
    # outside (.02 > δ = .01): β doubles, no stop before max_steps
    d = adapt_beta(0.02, 0.01, 0.1, steps_done=3, **RULE)
    assert (d.beta, d.stop, d.within) == (approx(0.2), False, False)
    # well inside (.004 < δ/2 = .005): β halves; stop once min_steps are done
    d = adapt_beta(0.004, 0.01, 0.1, steps_done=2, **RULE)
    assert (d.beta, d.stop, d.within) == (approx(0.05), True, True)
    d = adapt_beta(0.004, 0.01, 0.1, steps_done=1, **RULE)
    assert not d.stop and d.within
    # inside but near δ (.008 ≥ .005): β kept
    assert adapt_beta(0.008, 0.01, 0.1, steps_done=1, **RULE).beta == approx(0.1)
    # at max_steps the loop stops even outside (the caller restores the last iterate inside)
    d = adapt_beta(0.5, 0.01, 0.1, steps_done=5, **RULE)
    assert d.stop and not d.within
    # clamps and a NaN measurement (treated as outside)
    assert adapt_beta(0.5, 0.01, 0.8, steps_done=1, **RULE).beta == 1.0
    assert adapt_beta(0.0, 0.01, 0.0015, steps_done=1, **RULE).beta == 1e-3
    d = adapt_beta(float("nan"), 0.01, 0.1, steps_done=1, **RULE)
    assert not d.within and d.beta == approx(0.2)
    with pytest.raises(ValueError, match="delta > 0"):
        adapt_beta(0.0, 0.0, 0.1, steps_done=1, **RULE)


def test_team_advantage_matches_a_loop_reference():
    rng = np.random.default_rng(3)
    ret, gid = rng.normal(size=40), rng.integers(0, 5, size=40)
    out = team_advantage(ret, gid, a_clip=1.2, eps_norm=1e-3)
    for g in np.unique(gid):
        r = ret[gid == g]
        ref = np.clip((r - r.mean()) / np.sqrt(((r - r.mean()) ** 2).mean() + 1e-3), -1.2, 1.2)
        assert out[gid == g] == approx(ref)
