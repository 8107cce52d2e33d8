"""The alignment equations (tlm-DRE Eq.8-10, 16, 17; DIL; DPO) against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from slea.algorithms.alignment import (
    bregman_terms,
    chosen_log_factor,
    dil_loss,
    dpo_loss,
    multiscale_logratio,
    sft_nll,
    tlm_dre_loss,
    turn_adequacy,
    turn_dpo_loss,
    turn_weights,
)

approx = pytest.approx
LN = math.log


def t(*rows):
    return torch.tensor(rows, dtype=torch.float64)


# Eq.9 ---------------------------------------------------------------------------------------------------------


def test_turn_adequacy_is_exp_of_the_mean_token_logprob():
    # turn 0: tokens at prob .5 and .8 -> geometric mean sqrt(.4) = 0.632456; turn 1: one token at .9
    p = turn_adequacy([np.log([0.5, 0.8]), np.array([LN(0.9)])])
    assert p.tolist() == approx([math.sqrt(0.4), 0.9])
    assert p[0] == approx(0.6324555320)


def test_turn_adequacy_does_not_underflow():
    # 40 tokens at log-prob -30: the product of probabilities is e^-1200 (0 in float64), so a naive
    # geometric mean prod(p)^(1/40) is 0; the mean of the logs gives e^-30 = 9.357623e-14.
    lp = np.full(40, -30.0)
    assert np.prod(np.exp(lp)) ** (1 / 40) == 0.0  # what the naive form returns
    assert turn_adequacy([lp])[0] == approx(math.exp(-30), rel=1e-12)
    assert turn_adequacy([lp])[0] == approx(9.357623e-14, rel=1e-6)


def test_turn_adequacy_rejects_an_empty_turn():
    with pytest.raises(ValueError, match="turn 1 has no action tokens"):
        turn_adequacy([np.array([-1.0]), np.array([])])


# Eq.10 --------------------------------------------------------------------------------------------------------


def test_turn_weights_on_both_sides_and_exactly_at_the_pivot():
    above = np.nextafter(0.9, 1.0)
    p = np.array([0.95, 0.9, above, 0.3, 1.0])
    # > pivot -> omega_L = .2 ; <= pivot (0.9 itself included) -> omega_U = 1
    assert turn_weights(p).tolist() == [0.2, 1.0, 0.2, 1.0, 0.2]
    assert turn_weights(p, pivot=0.5, omega_low=0.0, omega_high=0.7).tolist() == [0.0, 0.0, 0.0, 0.7, 0.0]


# DPO ----------------------------------------------------------------------------------------------------------


def test_dpo_against_a_hand_calculation():
    # beta .1, u_w = 1, u_l = -2: -log sigmoid(0.3) = log(1 + e^-0.3) = log(1.7408182) = 0.5543552
    # second pair u_w = u_l: log 2 = 0.6931472
    loss = dpo_loss(t(1.0, 0.5), t(-2.0, 0.5), beta=0.1)
    assert loss.tolist() == approx([0.5543552, 0.6931472], rel=1e-6)
    assert loss[0].item() == approx(LN(1 + math.exp(-0.3)))


def test_dpo_gradient_pushes_chosen_up_and_rejected_down():
    c, r = t(1.0).requires_grad_(), t(-2.0).requires_grad_()
    dpo_loss(c, r, beta=0.1).sum().backward()
    # d/dc = -beta * sigmoid(-0.3) = -0.1 * 0.4255575 ; d/dr = +0.0425558
    assert c.grad.item() == approx(-0.1 / (1 + math.exp(0.3)))
    assert r.grad.item() == approx(0.1 / (1 + math.exp(0.3)))


def test_dpo_is_finite_for_huge_margins():
    loss = dpo_loss(t(-5000.0), t(5000.0), beta=1.0)
    assert loss.item() == approx(10000.0)


# Eq.8 and turn-weighted DPO -----------------------------------------------------------------------------------


def test_multiscale_logratio_and_turn_dpo():
    # chosen u = [.4, -.2], w = [.2, 1] -> .08 - .2 = -.12 ; rejected u = [.1, .3, -.5], w = [1, .2, 1] -> -.34
    cu, cw = t([0.4, -0.2, 0.0]), t([0.2, 1.0, 0.0])  # third turn is padding
    ru, rw = t([0.1, 0.3, -0.5]), t([1.0, 0.2, 1.0])
    assert multiscale_logratio(cu, cw).tolist() == approx([-0.12])
    assert multiscale_logratio(ru, rw).tolist() == approx([-0.34])
    # turn-DPO, beta .5: -log sigmoid(.5 * (-.12 + .34)) = log(1 + e^-0.11) = log(1.8958341) = 0.6396589
    assert turn_dpo_loss(cu, ru, cw, rw, beta=0.5).item() == approx(LN(1 + math.exp(-0.11)))
    assert turn_dpo_loss(cu, ru, cw, rw, beta=0.5).item() == approx(0.6396589, rel=1e-6)


def test_sft_nll_is_the_token_mean():
    # turns with log-prob sums -3 (3 tokens) and -1 (2 tokens): 4 / 5 = 0.8
    assert sft_nll(t(-3.0, -1.0), t(3.0, 2.0)).item() == approx(0.8)


# DIL kernels --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kernel", "expected"), [
    # r_w = 2, r_l = 1/2
    ("ukl", -LN(2) + 0.5),                         # -log r_w + r_l = -0.1931472
    ("lsif", -(2 - 1) + 0.5 * (0.25 - 1)),         # -(r_w - 1) + (r_l^2 - 1)/2 = -1.375
    ("bce", -LN(2 / 3) + LN(1.5)),                 # -log(r_w/(1+r_w)) + log(1+r_l) = 0.8109302
    ("basu", -((1.5 * math.sqrt(2) - 1) / 0.5) + 0.5 ** 1.5),  # alpha .5: -2.2426407 + 0.3535534
])
def test_dil_kernels_against_hand_values(kernel, expected):
    loss = dil_loss(t(LN(2)), t(LN(0.5)), kernel, alpha=0.5)
    assert loss.item() == approx(expected)


KERNEL_F = {
    "ukl": lambda r: r * math.log(r) - r,
    "lsif": lambda r: 0.5 * (r - 1) ** 2,
    "bce": lambda r: r * math.log(r) - (r + 1) * math.log(r + 1),
    "basu": lambda r: (r ** 1.7 - r) / 0.7,
}


@pytest.mark.parametrize("kernel", sorted(KERNEL_F))
def test_dil_equals_the_bregman_form_from_f_itself(kernel):
    # An independent reference: DIL Eq.5, -[f'(r_w) - (f'(r_l) r_l - f(r_l))], f' by central differences.
    f = KERNEL_F[kernel]

    def df(r, h=1e-6):
        return (f(r + h) - f(r - h)) / (2 * h)

    for rw, rl in [(2.0, 0.5), (0.3, 1.7), (1.0, 1.0)]:
        ref = -(df(rw) - (df(rl) * rl - f(rl)))
        got = dil_loss(t(LN(rw)), t(LN(rl)), kernel, alpha=0.7).item()
        # LSIF and BCE drop no constant; the derivation is exact for all four
        assert got == approx(ref, rel=1e-6, abs=1e-6)


def test_bregman_terms_reject_unknown_kernels_and_bad_alpha():
    with pytest.raises(ValueError, match="known: ukl, lsif, bce, basu"):
        bregman_terms(t(0.0), "kl")
    with pytest.raises(ValueError, match="alpha > 0"):
        bregman_terms(t(0.0), "basu", alpha=0.0)


# tlm-DRE Eq.16/17 ---------------------------------------------------------------------------------------------

# One pair: chosen 2 turns u = [.4, -.2], w = [.2, 1], reference log-probs [-.5, -3] over [5, 3] tokens;
# rejected 3 turns u = [.1, .3, -.5], w = [1, .2, 1]. So s_w = -.12, s_l = -.34 (see above).
CU, CW, CREF, CN = t([0.4, -0.2]), t([0.2, 1.0]), t([-0.5, -3.0]), t([5.0, 3.0])
RU, RW = t([0.1, 0.3, -0.5]), t([1.0, 0.2, 1.0])


@pytest.mark.parametrize(("reading", "log_c"), [
    ("mean", 0.8 * (-0.5 / 5) + 0.0 * (-3.0 / 3)),  # (1 - w) * mean token log-prob: -0.08
    ("turn", 0.8 * (-0.5) + 0.0 * (-3.0)),          # literal Eq.17, whole-turn log-prob: -0.4
    ("none", 0.0),
])
def test_tlm_dre_ukl_is_eq17(reading, log_c):
    # Eq.17: exp(s_l) - c_w * s_w = e^-0.34 + c_w * 0.12
    #   mean: 0.7117703 + 0.9231163 * .12 = 0.8225443 ; turn: 0.7117703 + 0.6703200 * .12 = 0.7922087
    assert chosen_log_factor(CREF, CW, CN, reading).tolist() == approx([log_c])
    loss = tlm_dre_loss(CU, RU, CW, RW, CREF, CN, kernel="ukl", chosen_factor=reading)
    assert loss.item() == approx(math.exp(-0.34) + math.exp(log_c) * 0.12)
    expected = {"mean": 0.8225443, "turn": 0.7922087, "none": 0.8317703}[reading]
    assert loss.item() == approx(expected, rel=1e-6)


def test_tlm_dre_padding_changes_nothing():
    pad = tlm_dre_loss(t([0.4, -0.2, 0.0]), t([0.1, 0.3, -0.5, 0.0]), t([0.2, 1.0, 0.0]), t([1.0, 0.2, 1.0, 0.0]),
                       t([-0.5, -3.0, 0.0]), t([5.0, 3.0, 0.0]))
    assert pad.item() == approx(tlm_dre_loss(CU, RU, CW, RW, CREF, CN).item())


def test_tlm_dre_with_unit_weights_and_no_factor_is_dil():
    ones_c, ones_r = torch.ones_like(CU), torch.ones_like(RU)
    for kernel in ("ukl", "lsif", "bce", "basu"):
        got = tlm_dre_loss(CU, RU, ones_c, ones_r, CREF, CN, kernel=kernel, chosen_factor="turn")
        # omega = 1 everywhere: c_w = prod pi_ref^0 = 1 and log r_hat = sum u -> DIL on (.2, -.1)
        assert got.item() == approx(dil_loss(t(0.2), t(-0.1), kernel).item())


def test_tlm_dre_gradients_are_the_weights():
    cu, ru = CU.clone().requires_grad_(), RU.clone().requires_grad_()
    tlm_dre_loss(cu, ru, CW, RW, CREF, CN, chosen_factor="mean").sum().backward()
    c = math.exp(-0.08)
    # UKL: dL/du_w,i = -c_w * w_i ; dL/du_l,i = w_i * exp(s_l)
    assert cu.grad[0].tolist() == approx([-c * 0.2, -c * 1.0])
    assert ru.grad[0].tolist() == approx([math.exp(-0.34) * w for w in (1.0, 0.2, 1.0)])


def test_tlm_dre_underflow_40_turns_at_logprob_minus_30():
    # Rejected: 40 turns, policy log-prob -30 and reference -30.5 per turn (u = .5), all uncertain (w = 1):
    # the literal ratio of products is e^-1200 / e^-1220, i.e. 0/0 in float64; in log space it is e^20.
    n = 40
    pol, ref = torch.full((1, n), -30.0, dtype=torch.float64), torch.full((1, n), -30.5, dtype=torch.float64)
    assert math.isnan((torch.exp(pol.sum()) / torch.exp(ref.sum())).item())  # the naive form
    ru = (pol - ref).requires_grad_()
    rw = torch.ones(1, n, dtype=torch.float64)
    # Chosen: 40 confident turns (w = .2), u = .1 each, reference log-prob -30 per turn over 10 tokens.
    cu = torch.full((1, n), 0.1, dtype=torch.float64, requires_grad=True)
    cw = torch.full((1, n), 0.2, dtype=torch.float64)
    cref, cn = torch.full((1, n), -30.0, dtype=torch.float64), torch.full((1, n), 10.0, dtype=torch.float64)
    s_w = 0.2 * 0.1 * n  # 0.8
    # literal: c_w = e^(.8 * -30 * 40) = e^-960 -> 0 in float64: the loss is e^20 alone, still finite
    lit = tlm_dre_loss(cu, ru, cw, rw, cref, cn, chosen_factor="turn")
    assert lit.item() == approx(math.exp(20.0))
    # default reading: c_w = e^(.8 * -3 * 40) = e^-96 = 2.03e-42 (float64 keeps it)
    mean = tlm_dre_loss(cu, ru, cw, rw, cref, cn, chosen_factor="mean")
    assert mean.item() == approx(math.exp(20.0) - math.exp(-96.0) * s_w, rel=1e-12)
    mean.sum().backward()
    assert torch.isfinite(cu.grad).all() and torch.isfinite(ru.grad).all()
    assert ru.grad[0, 0].item() == approx(math.exp(20.0))  # w_l * r_hat_l
    assert cu.grad[0, 0].item() == approx(-math.exp(-96.0) * 0.2)


@pytest.mark.parametrize("kernel", ["ukl", "lsif", "bce", "basu"])
def test_every_kernel_has_finite_gradients_in_float32(kernel):
    # float32, log-ratios from -50 to +20 (r from e^-50 to e^20): losses and gradients stay finite
    cu = torch.tensor([[-50.0, 3.0], [10.0, 10.0]], requires_grad=True)
    ru = torch.tensor([[20.0, -50.0], [-1.0, 0.0]], requires_grad=True)
    w = torch.tensor([[0.2, 1.0], [1.0, 0.2]])
    loss = tlm_dre_loss(cu, ru, w, w, torch.full((2, 2), -400.0), torch.full((2, 2), 20.0), kernel=kernel)
    loss.sum().backward()
    assert torch.isfinite(loss).all()
    assert torch.isfinite(cu.grad).all() and torch.isfinite(ru.grad).all()


def test_unknown_chosen_factor():
    with pytest.raises(ValueError, match="known: mean, turn, none"):
        tlm_dre_loss(CU, RU, CW, RW, CREF, CN, chosen_factor="prod")
