"""Policy losses, aggregation modes and the value loss against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from slea.algorithms import get_policy_loss, policy_loss_names
from slea.algorithms.losses import aggregate, value_loss

approx = pytest.approx
LN = math.log


def _tensors(ratios, advs, mask=None):
    old = torch.zeros(1, len(ratios), dtype=torch.float64)
    logp = torch.tensor([[LN(x) for x in ratios]], dtype=torch.float64, requires_grad=True)
    a = torch.tensor([advs], dtype=torch.float64)
    m = torch.ones_like(a) if mask is None else torch.tensor([mask], dtype=torch.float64)
    return logp, old, a, m


def test_registry():
    assert {"ppo_clip", "clip_higher", "dual_clip"} <= set(policy_loss_names())
    assert get_policy_loss("clip-higher") is get_policy_loss("clip_higher")
    with pytest.raises(KeyError, match="known: .*dual_clip.*ppo_clip"):
        get_policy_loss("nope")


def test_a_taken_name_is_replaced_only_when_asked():
    from slea.algorithms import registry as reg

    name = "test_replaceable_loss"
    try:
        reg.register_policy_loss(name)(lambda *a, **k: 1)
        with pytest.raises(ValueError, match="already registered"):
            reg.register_policy_loss(name)(lambda *a, **k: 2)
        reg.register_policy_loss(name, replace=True)(lambda *a, **k: 3)
        assert get_policy_loss(name)() == 3
    finally:
        reg.POLICY_LOSSES.remove(name)


def test_ppo_clip_all_four_branches():
    # eps .2: (ratio, A) -> per-token loss -min(ρA, clip(ρ)A)
    #   (1.5, +1): clipped, -1.2   (0.5, +1): -0.5   (0.5, -1): clipped, +0.8   (1.5, -1): +1.5
    logp, old, a, m = _tensors([1.5, 0.5, 0.5, 1.5], [1.0, 1.0, -1.0, -1.0])
    loss, met = get_policy_loss("ppo_clip")(logp, old, a, m, clip_ratio=0.2)
    assert loss.item() == approx((-1.2 - 0.5 + 0.8 + 1.5) / 4)
    assert met["clip_frac"] == approx(0.5)
    assert met["ratio_mean"] == approx(1.0)
    assert met["ratio_max_dev"] == approx(0.5)
    assert met["approx_kl"] == approx(-(2 * LN(1.5) + 2 * LN(0.5)) / 4)  # mean(old - new) = 0.1438410362
    assert met["approx_kl"] == approx(0.1438410362)
    loss.backward()
    # clipped tokens get no gradient; d(-Aρ)/dlogp = -Aρ, divided by 4 tokens
    assert logp.grad[0].tolist() == approx([0.0, -0.125, 0.0, 0.375])


def test_ppo_clip_mask_and_1d_advantages():
    # a masked token with a huge ratio changes nothing
    logp, old, a, m = _tensors([1.5, 0.5, 100.0], [1.0, 1.0, -1.0], mask=[1, 1, 0])
    loss, met = get_policy_loss("ppo_clip")(logp, old, a, m)
    assert loss.item() == approx((-1.2 - 0.5) / 2)
    assert met["ratio_max_dev"] == approx(0.5)
    # (B,) advantages broadcast over tokens
    logp2 = torch.log(torch.tensor([[1.5, 0.5], [0.5, 1.5]], dtype=torch.float64))
    loss2, _ = get_policy_loss("ppo_clip")(
        logp2,
        torch.zeros(2, 2, dtype=torch.float64),
        torch.tensor([1.0, -1.0], dtype=torch.float64),
        torch.ones(2, 2),
    )
    assert loss2.item() == approx((-1.2 - 0.5 + 0.8 + 1.5) / 4)


def test_clip_higher():
    # eps_low .2, eps_high .28: (1.25, +1) is inside [0.8, 1.28] -> -1.25 (ppo_clip .2 would give -1.2);
    # (1.5, +1) -> clipped at 1.28: -1.28; (0.7, -1) -> clipped at 0.8: +0.8
    logp, old, a, m = _tensors([1.25, 1.5, 0.7], [1.0, 1.0, -1.0])
    loss, met = get_policy_loss("clip_higher")(logp, old, a, m, clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert loss.item() == approx((-1.25 - 1.28 + 0.8) / 3)
    assert met["clip_frac"] == approx(2 / 3)
    loss_sym, _ = get_policy_loss("ppo_clip")(logp, old, a, m, clip_ratio=0.2)
    assert loss_sym.item() == approx((-1.2 - 1.2 + 0.8) / 3)


def test_dual_clip_lower_bound():
    # c = 3: (5, -1): PPO gives +5, dual-clip caps at -c·A = 3 ; (2, -1): 2 (< 3, untouched);
    # (5, +1): -1.2 (positive advantages are not affected) ; (0.5, -1): 0.8 (normal clip)
    logp, old, a, m = _tensors([5.0, 2.0, 5.0, 0.5], [-1.0, -1.0, 1.0, -1.0])
    loss, met = get_policy_loss("dual_clip")(logp, old, a, m, clip_ratio=0.2, clip_ratio_c=3.0)
    assert loss.item() == approx((3.0 + 2.0 - 1.2 + 0.8) / 4)
    assert met["clip_frac_lower"] == approx(0.25)
    assert met["clip_frac"] == approx(0.5)  # (5, +1) and (0.5, -1)
    loss.backward()
    assert logp.grad[0].tolist() == approx([0.0, 2.0 / 4, 0.0, 0.0])  # lower-clipped token: no gradient
    ppo, _ = get_policy_loss("ppo_clip")(logp, old, a, m, clip_ratio=0.2)
    assert ppo.item() == approx((5.0 + 2.0 - 1.2 + 0.8) / 4)
    with pytest.raises(ValueError):
        get_policy_loss("dual_clip")(logp, old, a, m, clip_ratio_c=1.0)


def test_unknown_config_key_is_rejected():
    logp, old, a, m = _tensors([1.0], [1.0])
    with pytest.raises(TypeError):
        get_policy_loss("ppo_clip")(logp, old, a, m, clip_eps=0.2)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 2.5),  # (1 + 2 + 3 + 4) / 4
        ("seq-mean-token-mean", 3.0),  # (6/3 + 4/1) / 2
        ("seq-mean-token-sum", 5.0),  # (6 + 4) / 2
        ("seq-mean-token-sum-norm", 5.0 / 3),  # / T = 3
    ],
)
def test_aggregate_modes(mode, expected):
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 50.0, 60.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # the empty third sequence is left out
    assert aggregate(loss, mask, mode).item() == approx(expected)


def test_aggregate_norm_const_and_unknown():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", norm_const=10).item() == approx(0.5)
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(loss, mask, "mean")


def test_policy_loss_uses_agg_mode():
    # two sequences: [(1.5,+1) clipped -1.2, (0.5,+1) -0.5] and [(0.5,-1) +0.8] (2nd token masked)
    logp = torch.log(torch.tensor([[1.5, 0.5], [0.5, 1.0]], dtype=torch.float64))
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0]])
    f = get_policy_loss("ppo_clip")
    zeros = torch.zeros(2, 2, dtype=torch.float64)
    assert f(logp, zeros, adv, mask, loss_agg_mode="token-mean")[0].item() == approx((-1.7 + 0.8) / 3)
    assert f(logp, zeros, adv, mask, loss_agg_mode="seq-mean-token-mean")[0].item() == approx(
        (-0.85 + 0.8) / 2
    )
    assert f(logp, zeros, adv, mask, loss_agg_mode="seq-mean-token-sum")[0].item() == approx((-1.7 + 0.8) / 2)


def test_value_loss_clipping():
    # token 1: (V - R)² = 1; clipped V = 0.5 + clip(0.5, ±.2) = 0.7 -> (0.7 - 2)² = 1.69 -> 1.69 (clipped)
    # token 2: (2 - 1)² = 1; V - V_old = 0 -> same 1
    v = torch.tensor([[1.0, 2.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[0.5, 2.0]], dtype=torch.float64)
    ret = torch.tensor([[2.0, 1.0]], dtype=torch.float64)
    mask = torch.ones(1, 2)
    loss, met = value_loss(v, old, ret, mask, clip=0.2)
    assert loss.item() == approx(0.5 * (1.69 + 1.0) / 2)
    assert met["vf_clip_frac"] == approx(0.5)
    assert met["vf_mse"] == approx(1.0)
    loss.backward()
    assert v.grad[0].tolist() == approx([0.0, 0.5])  # clipped branch: no gradient to V; 0.5·2·(2-1)/2
    plain, _ = value_loss(v, old, ret, mask, clip=None)
    assert plain.item() == approx(0.5)
