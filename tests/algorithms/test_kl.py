"""KL estimators k1 / k2 / k3 against hand values."""

from __future__ import annotations

import pytest
import torch

from slea.algorithms import kl_penalty
from slea.algorithms.kl import kl_estimator_names

approx = pytest.approx

LOGP = [-1.0, -2.0, -0.3]
REF = [-1.5, -1.0, -0.3]  # Δ = logp - ref = [0.5, -1.0, 0.0]


def _kl(est, logp=LOGP, ref=REF):
    return kl_penalty(
        torch.tensor(logp, dtype=torch.float64), torch.tensor(ref, dtype=torch.float64), est
    ).tolist()


def test_k1_k2_k3_hand_values():
    assert _kl("k1") == approx([0.5, -1.0, 0.0])
    assert _kl("k2") == approx([0.125, 0.5, 0.0])
    # exp(-Δ) + Δ - 1: Δ=.5 -> 0.6065306597 - 0.5 = 0.1065306597; Δ=-1 -> 2.7182818285 - 2 = 0.7182818285
    assert _kl("k3") == approx([0.1065306597, 0.7182818285, 0.0])
    assert _kl("abs") == approx([0.5, 1.0, 0.0])


def test_aliases_and_unknown():
    assert _kl("kl") == _kl("k1")
    assert _kl("mse") == _kl("k2")
    assert _kl("low_var_kl") == _kl("k3")
    assert {"k1", "k2", "k3", "low_var_kl"} <= set(kl_estimator_names())
    with pytest.raises(KeyError, match="k3"):
        _kl("k4")


def test_k3_clamps_like_verl():
    # Δ = -30: ref - logp = 30 clamped to 20 -> exp(20) - 21 clamped to 10
    # Δ = +30: ref - logp = -30 clamped to -20 -> exp(-20) + 19 clamped to 10
    assert _kl("k3", logp=[-30.0, 0.0], ref=[0.0, -30.0]) == approx([10.0, 10.0])
    assert all(v >= 0 for v in _kl("k3", logp=[-3.0, -0.1, -7.0], ref=[-0.2, -4.0, -7.5]))


def test_gradient_through_logprobs_only():
    logp = torch.tensor([[0.5, -1.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    pen = kl_penalty(logp, ref, "k2")
    assert pen[0].tolist() == approx([0.125, 0.5])
    pen.sum().backward()
    assert logp.grad[0].tolist() == approx([0.5, -1.0])  # d(½Δ²)/dΔ = Δ
    assert ref.grad is None
