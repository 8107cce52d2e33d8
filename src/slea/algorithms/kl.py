"""Per-token estimators of KL(π_θ ‖ π_ref) from sampled log-probs (Schulman 2020, "Approximating KL Divergence").

With ``Δ = log π_θ(a) − log π_ref(a)`` for a token ``a ~ π_θ``:

* ``k1`` (alias ``kl``): ``Δ`` — unbiased, high variance, can be negative;
* ``k2`` (alias ``mse``): ``½ Δ²`` — biased, low variance, ≥ 0;
* ``k3`` (alias ``low_var_kl``): ``exp(−Δ) + Δ − 1 = exp(ref − logp) − (ref − logp) − 1`` — unbiased, ≥ 0,
  low variance; the estimator GRPO uses (Shao et al. 2024, Eq. 4) and SLEA-RL/GiGPO's ``low_var_kl``.
  As verl, ``ref − logp`` is clamped to ±20 before ``exp`` and the result to [−10, 10];
* ``abs``: ``|Δ|``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["kl_estimator_names", "kl_penalty"]

_ESTIMATORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}
_ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}


_Estimator = Callable[[torch.Tensor], torch.Tensor]


def _estimator(name: str) -> Callable[[_Estimator], _Estimator]:
    def deco(fn: _Estimator) -> _Estimator:
        _ESTIMATORS[name] = fn
        return fn

    return deco


@_estimator("k1")
def _k1(delta: torch.Tensor) -> torch.Tensor:
    """Schulman 2020, k1 = log(p/q) for x ~ p."""
    return delta


@_estimator("k2")
def _k2(delta: torch.Tensor) -> torch.Tensor:
    """Schulman 2020, k2 = ½ (log(p/q))²."""
    return 0.5 * delta.square()


@_estimator("k3")
def _k3(delta: torch.Tensor) -> torch.Tensor:
    """Schulman 2020, k3 = (r − 1) − log r with r = q/p; GRPO Eq. 4; verl ``low_var_kl`` clamps."""
    neg = (-delta).clamp(-20.0, 20.0)  # ref − logp
    return (torch.exp(neg) - neg - 1.0).clamp(-10.0, 10.0)


@_estimator("abs")
def _abs(delta: torch.Tensor) -> torch.Tensor:
    """``|log(p/q)|`` (verl ``abs``)."""
    return delta.abs()


def kl_estimator_names() -> list[str]:
    """Known estimator names, aliases included."""
    return sorted([*_ESTIMATORS, *_ALIASES])


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token KL estimate (same shape as ``logprobs``); gradients flow through ``logprobs`` only."""
    key = _ALIASES.get(estimator, estimator)
    if key not in _ESTIMATORS:
        raise KeyError(f"unknown KL estimator {estimator!r}; known: {', '.join(kl_estimator_names())}")
    return _ESTIMATORS[key](logprobs - ref_logprobs.detach())
