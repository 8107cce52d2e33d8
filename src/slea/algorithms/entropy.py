"""Entropy: the policy's token entropy, and the covariance-based losses that keep it from collapsing.

``token_entropy`` is the Shannon entropy of each position's (tempered) next-token distribution; generation logs it
on the sampled responses (``rollout/entropy``) and the update on the trained ones (``update/entropy``), where
``algorithm.entropy_coef`` turns it into a bonus (:func:`slea.trainer.update.ppo_update`, as verl's
``entropy_coeff``).

Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", arXiv:2505.22617, §4 "Entropy control by covariance regularization"; verl ``loss_mode: clip_cov |
kl_cov``): under policy-gradient updates the entropy changes by minus the covariance between a token's log-prob
and its advantage (the paper's Theorem 2), so the tokens with the largest ``Cov(y) = (log π(y) − mean log π) ·
(A(y) − mean A)`` are the ones that drive entropy down. Clip-Cov stops the gradient of a small random share of
the tokens whose covariance lies in ``[ω_low, ω_high]``; KL-Cov adds a KL penalty ``β·|log π − log π_old|`` on the
top share of tokens by covariance. Both are registered policy losses, so they combine with every algorithm.
"""

from __future__ import annotations

import torch

from slea.algorithms.losses import LossAndMetrics, aggregate, clipped_surrogate, log_ratio, policy_metrics
from slea.algorithms.registry import register_policy_loss

__all__ = ["clip_cov", "clip_cov_keep", "entropy_from_logprobs", "kl_cov", "kl_cov_tokens", "token_covariance", "token_entropy"]


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """``H = −Σ_v p_v log p_v`` of ``softmax(logits)`` over the last axis, one value per position (computed in
    float32 or wider). Differentiable: the entropy bonus's gradient flows through it."""
    return entropy_from_logprobs(torch.log_softmax(logits.float(), dim=-1))


def entropy_from_logprobs(logp: torch.Tensor) -> torch.Tensor:
    """:func:`token_entropy` from normalised log-probabilities ``logp`` (a ``log_softmax`` the caller already has);
    a token of probability 0 adds 0."""
    p = logp.exp()
    return -(p * logp.masked_fill(p == 0, 0.0)).sum(-1)


def token_covariance(logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``Cov(y_i) = (log π(y_i) − mean_j log π(y_j)) · (A(y_i) − mean_j A(y_j))`` per token, the means over the
    batch's response tokens (``mask``); Cui et al. 2025, §4 (the centred cross-product whose batch mean is the
    covariance that drives the entropy change). Detached: it only selects tokens. Masked positions are 0."""
    m = mask.to(torch.float32)
    n = m.sum().clamp(min=1.0)
    lp, adv = logprobs.detach().float(), advantages.detach().float()
    lp_c = lp - (lp * m).sum() / n
    adv_c = adv - (adv * m).sum() / n
    return lp_c * adv_c * m


def clip_cov_keep(cov: torch.Tensor, mask: torch.Tensor, ratio: float, low: float, high: float,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """Clip-Cov's token selection (Cui et al. 2025, §4): among the response tokens with ``low < Cov < high``,
    ``max(1, ⌊ratio · n_tokens⌋)`` drawn uniformly at random (fewer when fewer qualify) get weight 0, the rest 1.
    Returns the ``(B, T)`` 0/1 weights."""
    eligible = (cov > low) & (cov < high) & mask.bool()
    keep = torch.ones_like(cov)
    idx = torch.nonzero(eligible)
    if len(idx):
        n_clip = min(max(1, int(ratio * float(mask.sum()))), len(idx))
        pick = idx[torch.randperm(len(idx), generator=generator)[:n_clip].to(idx.device)]
        keep[pick[:, 0], pick[:, 1]] = 0.0
    return keep


def kl_cov_tokens(cov: torch.Tensor, mask: torch.Tensor, ratio: float) -> torch.Tensor:
    """KL-Cov's token selection (Cui et al. 2025, §4): the top ``max(1, ⌊ratio · n_tokens⌋)`` response tokens by
    ``Cov`` get 1, every other position 0. Returns the ``(B, T)`` 0/1 selection."""
    sel = torch.zeros_like(cov)
    n = int(mask.sum())
    if n:
        scores = cov.masked_fill(~mask.bool(), float("-inf")).flatten()
        top = torch.topk(scores, min(max(1, int(ratio * n)), n)).indices
        sel.view(-1)[top] = 1.0
    return sel


def _broadcast(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if advantages.dim() == like.dim() - 1:
        advantages = advantages.unsqueeze(-1)
    return advantages.to(like.dtype).expand_as(like).detach()


@register_policy_loss("clip_cov")
def clip_cov(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
             mask: torch.Tensor, *, clip_ratio: float = 0.2, clip_ratio_high: float | None = None,
             clip_cov_ratio: float = 2e-4, clip_cov_lb: float = 1.0, clip_cov_ub: float = 5.0,
             loss_agg_mode: str = "token-mean") -> LossAndMetrics:
    """Clip-Cov (Cui et al. 2025, §4): the PPO-clip loss (Schulman et al. 2017, Eq. 7; ``clip_ratio_high`` for
    clip-higher) with the gradient of :func:`clip_cov_keep`'s tokens detached — a ``clip_cov_ratio`` share of the
    tokens whose ``Cov`` lies in ``(clip_cov_lb, clip_cov_ub)``, drawn at random (torch's global RNG, seeded by the
    run). Tokens the PPO clip already clipped are not candidates. Defaults as the paper and verl: r = 2e-4,
    ω_low = 1, ω_high = 5. Extra metric: ``cov_clip_frac`` (share of response tokens detached)."""
    adv = _broadcast(advantages, logprobs)
    lr = log_ratio(logprobs, old_logprobs.detach())
    ratio = torch.exp(lr)
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    loss_mat, clipped, _ = clipped_surrogate(ratio, adv, clip_ratio, high)
    cov = token_covariance(logprobs, adv, mask).masked_fill(clipped.bool(), float("-inf"))
    keep = clip_cov_keep(cov, mask, clip_cov_ratio, clip_cov_lb, clip_cov_ub)
    loss = aggregate(loss_mat * keep, mask, loss_agg_mode)
    metrics = policy_metrics(lr, ratio, clipped, mask)
    metrics["cov_clip_frac"] = float(((1 - keep) * mask).sum() / mask.sum().clamp(min=1.0))
    return loss, metrics


@register_policy_loss("kl_cov")
def kl_cov(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
           mask: torch.Tensor, *, kl_cov_ratio: float = 2e-4, ppo_kl_coef: float = 1.0,
           loss_agg_mode: str = "token-mean") -> LossAndMetrics:
    """KL-Cov (Cui et al. 2025, §4): the unclipped surrogate ``−ρA`` on every token, plus ``β·|log π − log π_old|``
    on :func:`kl_cov_tokens`'s top ``kl_cov_ratio`` share by ``Cov`` (β = ``ppo_kl_coef``). No ratio clip: the KL
    term alone restrains the tokens that drive entropy down. Defaults as verl: k = 2e-4, β = 1 (the paper uses
    k = 2e-3 for its 7B runs). Extra metric: ``cov_kl_frac`` (share of response tokens penalised)."""
    adv = _broadcast(advantages, logprobs)
    lr = log_ratio(logprobs, old_logprobs.detach())
    ratio = torch.exp(lr)
    sel = kl_cov_tokens(token_covariance(logprobs, adv, mask), mask, kl_cov_ratio)
    loss_mat = -adv * ratio + ppo_kl_coef * lr.abs() * sel
    loss = aggregate(loss_mat, mask, loss_agg_mode)
    metrics = policy_metrics(lr, ratio, torch.zeros_like(ratio), mask)
    metrics["cov_kl_frac"] = float((sel * mask).sum() / mask.sum().clamp(min=1.0))
    return loss, metrics
