"""Policy-gradient surrogate losses (PPO clip, clip-higher, dual-clip), loss aggregation and the PPO value loss.

Every policy loss is registered by name and has the signature::

    loss, metrics = fn(logprobs, old_logprobs, advantages, mask, **cfg)

with ``(B, T)`` tensors (``advantages`` already broadcast per token; a ``(B,)`` tensor is broadcast here),
``mask`` 1 on the response tokens that count. ``loss`` is a scalar tensor to *minimise*; ``metrics`` holds
floats: ``clip_frac`` (tokens whose clipped branch is active), ``approx_kl`` (mean of ``old − new`` log-prob,
the k1 estimate of KL(old‖new)), ``ratio_mean``, ``ratio_max_dev`` (max ``|ratio − 1|``) and, for dual-clip,
``clip_frac_lower``. Config keys follow verl's names: ``clip_ratio``, ``clip_ratio_low``, ``clip_ratio_high``,
``clip_ratio_c``, ``loss_agg_mode``.
"""

from __future__ import annotations

import torch

from slea.algorithms.registry import register_policy_loss

__all__ = [
    "AGG_MODES",
    "aggregate",
    "clip_higher",
    "clipped_surrogate",
    "dual_clip",
    "policy_metrics",
    "ppo_clip",
    "value_loss",
]

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")

# A policy loss's result: the scalar loss to minimise and its metrics.
LossAndMetrics = tuple[torch.Tensor, dict[str, float]]

LOG_RATIO_CLAMP = 20.0  # as verl: exp() of a log-ratio beyond ±20 is clamped before it can overflow


def _mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.to(dtype=like.dtype)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over the positions where ``mask`` is 1 (0 when the mask is empty)."""
    m = _mask(mask, x)
    return (x * m).sum() / m.sum().clamp(min=1.0)


def aggregate(
    loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", norm_const: float | None = None
) -> torch.Tensor:
    """Reduce a per-token ``(B, T)`` loss to a scalar (verl ``agg_loss`` names).

    * ``token-mean``: ``Σ_{i,t} m·l / Σ m`` — every token weighs the same (DAPO, Yu et al. 2025, §3.3
      "token-level policy gradient loss"; also verl's default);
    * ``seq-mean-token-mean``: mean over sequences of each sequence's token mean — the GRPO paper's
      ``(1/G) Σ_i (1/|o_i|) Σ_t`` (Shao et al. 2024, Eq. 3; SLEA-RL Eq.7, GiGPO Eq.9 per trajectory);
    * ``seq-mean-token-sum``: mean over sequences of each sequence's token sum (Dr.GRPO, Liu et al. 2025,
      removes the 1/|o_i| length bias);
    * ``seq-mean-token-sum-norm``: the same divided by a constant ``norm_const`` (default: ``T``, the padded
      response length) — Dr.GRPO's "divide by a constant MAX_TOKENS" form.

    Sequences with an empty mask are left out of the sequence means.
    """
    m = _mask(mask, loss_mat)
    if mode == "token-mean":
        return (loss_mat * m).sum() / m.sum().clamp(min=1.0)
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; known: {', '.join(AGG_MODES)}")
    if loss_mat.dim() < 2:
        raise ValueError("sequence-level aggregation needs (B, T) tensors")
    tok = m.sum(dim=-1)
    seq_sum = (loss_mat * m).sum(dim=-1)
    present = (tok > 0).to(loss_mat.dtype)
    n_seq = present.sum().clamp(min=1.0)
    if mode == "seq-mean-token-mean":
        return (seq_sum / tok.clamp(min=1.0) * present).sum() / n_seq
    if mode == "seq-mean-token-sum":
        return (seq_sum * present).sum() / n_seq
    const = float(loss_mat.shape[-1] if norm_const is None else norm_const)
    return (seq_sum * present).sum() / n_seq / const


def log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    """``log ρ = log π_θ − log π_old``, clamped to ±20 (verl) so ``exp`` cannot overflow."""
    return (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, low: float, high: float, c: float | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO surrogate *loss* and its clip indicators.

    ``−min(ρA, clip(ρ, 1−low, 1+high)·A)`` (Schulman et al. 2017, PPO Eq. 7; asymmetric bounds = DAPO
    clip-higher, Yu et al. 2025, §3.1). With ``c`` (> 1), dual-clip (Ye et al. 2020, "Mastering Complex
    Control in MOBA Games with Deep RL", AAAI; verl ``clip_ratio_c``): for ``A < 0`` the loss is further capped at
    ``−c·A``, i.e. the objective becomes ``max(min(ρA, clip(ρ)A), c·A)``.
    Returns ``(loss, clipped, clipped_lower)`` where the indicators are 0/1 tensors.
    """
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - low, 1.0 + high)
    loss = torch.maximum(unclipped, clipped)
    is_clipped = (clipped > unclipped).to(ratio.dtype)
    is_lower = torch.zeros_like(ratio)
    if c is not None:
        if c <= 1.0:
            raise ValueError(f"dual-clip constant clip_ratio_c must be > 1, got {c}")
        cap = -adv * c
        capped = torch.minimum(loss, cap)
        neg = adv < 0
        is_lower = ((loss > cap) & neg).to(ratio.dtype)
        loss = torch.where(neg, capped, loss)
    return loss, is_clipped, is_lower


def _policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                 mask: torch.Tensor, low: float, high: float, c: float | None, loss_agg_mode: str
                 ) -> LossAndMetrics:
    if advantages.dim() == logprobs.dim() - 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.to(logprobs.dtype).expand_as(logprobs)
    old_logprobs = old_logprobs.detach()
    lr = log_ratio(logprobs, old_logprobs)
    ratio = torch.exp(lr)
    loss_mat, clipped, lower = clipped_surrogate(ratio, advantages.detach(), low, high, c)
    loss = aggregate(loss_mat, mask, loss_agg_mode)
    metrics = policy_metrics(lr, ratio, clipped, mask)
    if c is not None:
        metrics["clip_frac_lower"] = float(masked_mean(lower.detach(), _mask(mask, ratio)))
    return loss, metrics


@torch.no_grad()
def policy_metrics(lr: torch.Tensor, ratio: torch.Tensor, clipped: torch.Tensor, mask: torch.Tensor
                   ) -> dict[str, float]:
    """The metrics every policy loss reports over the response tokens (``mask``): ``clip_frac``, ``approx_kl``
    (mean of ``old − new``), ``ratio_mean``, ``ratio_dev_mean`` and ``ratio_max_dev`` (mean and max ``|ρ − 1|``)."""
    m = _mask(mask, ratio)
    present = m.bool()
    dev = (ratio - 1.0).abs()
    return {
        "clip_frac": float(masked_mean(clipped, m)),
        "approx_kl": float(masked_mean(-lr, m)),
        "ratio_mean": float(masked_mean(ratio, m)),
        "ratio_dev_mean": float(masked_mean(dev, m)),
        "ratio_max_dev": float(dev[present].max()) if present.any() else 0.0,
    }


@register_policy_loss("ppo_clip")
def ppo_clip(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
    clip_ratio: float = 0.2, loss_agg_mode: str = "token-mean"
) -> LossAndMetrics:
    """PPO clipped surrogate (Schulman et al. 2017, Eq. 7), symmetric ``ε = clip_ratio``; the policy term of
    GRPO (Shao et al. 2024, Eq. 3), GiGPO Eq.9 and SLEA-RL Eq.7."""
    return _policy_loss(logprobs, old_logprobs, advantages, mask, clip_ratio, clip_ratio, None, loss_agg_mode)


@register_policy_loss("clip_higher")
def clip_higher(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.28,
    loss_agg_mode: str = "token-mean",
) -> LossAndMetrics:
    """DAPO clip-higher (Yu et al. 2025, §3.1 "Clip-Higher"): ``clip(ρ, 1−ε_low, 1+ε_high)`` with ``ε_high > ε_low``
    (paper: 0.2 / 0.28) so low-probability tokens can rise; DAPO aggregates with ``token-mean``."""
    return _policy_loss(
        logprobs, old_logprobs, advantages, mask, clip_ratio_low, clip_ratio_high, None, loss_agg_mode
    )


@register_policy_loss("dual_clip")
def dual_clip(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
) -> LossAndMetrics:
    """Dual-clip PPO (Ye et al. 2020; verl ``clip_ratio_c``, default 3): the PPO-clip objective, and for
    negative advantages a lower bound ``c·A`` so a huge ratio on a bad action cannot blow up the loss.
    ``clip_ratio_low``/``clip_ratio_high`` override ``clip_ratio`` (dual-clip with clip-higher)."""
    low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    return _policy_loss(logprobs, old_logprobs, advantages, mask, low, high, clip_ratio_c, loss_agg_mode)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float | None = 0.2,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped value loss: ``½ · agg(max((V − R)², (V_old + clip(V − V_old, ±clip) − R)²))``.

    Schulman et al. 2017 / OpenAI baselines ``ppo2`` value clipping, as verl ``compute_value_loss``;
    ``clip=None`` gives the plain ``½ (V − R)²``. Metrics: ``vf_clip_frac`` (tokens where the clipped branch
    is larger), ``vf_mse`` (unclipped), ``vpred_mean``.
    """
    returns = returns.detach().to(values.dtype)
    old_values = old_values.detach().to(values.dtype)
    err1 = (values - returns) ** 2
    if clip is None:
        loss_mat, is_clipped = err1, torch.zeros_like(err1)
    else:
        v_clip = old_values + (values - old_values).clamp(-clip, clip)
        err2 = (v_clip - returns) ** 2
        loss_mat = torch.maximum(err1, err2)
        is_clipped = (err2 > err1).to(values.dtype)
    loss = 0.5 * aggregate(loss_mat, mask, loss_agg_mode)
    with torch.no_grad():
        metrics = {
            "vf_clip_frac": float(masked_mean(is_clipped, mask)),
            "vf_mse": float(masked_mean(err1, mask)),
            "vpred_mean": float(masked_mean(values, mask)),
        }
    return loss, metrics
