"""TeamTR's equations: the clipped team advantage, the token-decomposed KL monitor, the trust-region surrogate and
the adaptive-β rule.

TeamTR (Xie et al., "Trust-Region Fine-Tuning for Multi-Agent LLM Coordination", arXiv 2605.15207, ICML 2026)
fine-tunes the agents of a shared-context team one at a time, each update kept inside a
token-level KL trust region around the agent's pre-update policy ``π_cur``:

* :func:`team_advantage` — Eq.9, ``clip((R − μ)/σ, ±A_clip)`` over the G rollouts of a prompt;
* :func:`token_kl` — Eq.11, the monitored ``d̂ = (1/|M|) Σ_m Σ_u log π_cur(x_u) − log π_new(x_u)``;
* :func:`teamtr_surrogate` — Eq.10, the clipped surrogate with a *message-level* ratio
  ``w(m; s) = Π_u π_new/π_cur`` minus ``β·d̂`` (registered as the policy loss ``teamtr``);
* :func:`adapt_beta` — the rule that adapts β until ``d̂ ≤ δ_i`` (the paper leaves it unspecified: our choice,
  documented there).

The estimator registered as ``algorithm.name: teamtr`` (needs a team) is Eq.9 over a step-row batch. This module
imports no torch: the tensor functions use tensor methods only, so looking an algorithm up stays cheap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from slea.algorithms.batch import StepBatch
from slea.algorithms.registry import register_algorithm, register_policy_loss

if TYPE_CHECKING:
    import torch

__all__ = ["KL_ESTIMATORS", "BetaDecision", "adapt_beta", "team_advantage", "teamtr", "teamtr_loss", "teamtr_surrogate", "token_kl"]

LOG_RATIO_CLAMP = 20.0  # a message's summed log-ratio is clamped before exp (as the token losses, verl)


def team_advantage(returns: Any, group_ids: Any, a_clip: float, eps_norm: float) -> np.ndarray:
    """TeamTR Eq.9: ``Ã_g = clip((R_g − μ)/σ, −A_clip, A_clip)`` with ``μ`` the mean of the group's returns and
    ``σ = sqrt((1/G) Σ_g (R_g − μ)² + ε_norm)`` (population variance, ``ε_norm`` inside the root).

    ``returns``: one team return per rollout; ``group_ids``: the prompt (task group) of each rollout. Returns one
    advantage per rollout, in input order. A group whose returns are all equal gets exactly 0."""
    r = np.asarray(returns, dtype=np.float64)
    if a_clip <= 0 or eps_norm < 0:
        raise ValueError(f"team_advantage: a_clip must be > 0 and eps_norm >= 0 (got {a_clip}, {eps_norm})")
    if r.size == 0:
        return np.zeros(0, np.float64)
    _, codes = np.unique(np.asarray(group_ids), return_inverse=True)
    codes = codes.reshape(-1)
    count = np.bincount(codes)
    ref = np.empty(len(count))
    ref[codes] = r  # shift by a member: an all-equal group is exactly 0
    x = r - ref[codes]
    mean = np.bincount(codes, weights=x) / count
    dev = x - mean[codes]
    var = np.bincount(codes, weights=dev * dev) / count
    sigma = np.sqrt(var + eps_norm)[codes]
    with np.errstate(divide="ignore", invalid="ignore"):
        adv = np.where(sigma > 0, dev / sigma, 0.0)
    return np.clip(adv, -a_clip, a_clip)


KL_ESTIMATORS = ("k1", "k3")


def token_kl(logp_cur: Any, logp_new: Any, mask: Any, estimator: str = "k3") -> Any:
    """TeamTR Eq.11 (Lemma 3.2's token decomposition): per message, the sum over its tokens of
    ``log π_cur(x_u|s,x_<u) − log π_new(x_u|s,x_<u)``, averaged over the messages.

    ``(B, T)`` tensors (or, for ``k1``, numpy arrays), one row per message of the agent being updated, sampled from
    ``π_cur`` (Eq.11's ``M_j``: all of the agent's messages, whatever their advantage); ``mask`` marks each row's
    tokens. Rows with no token are not messages (left out of the mean); no message at all gives 0. Gradients flow
    through ``logp_new`` (and ``logp_cur`` unless detached).

    ``estimator``: ``k1`` is Eq.11 as printed (an unbiased estimate of KL(π_cur ‖ π_new) that can be negative on a
    finite sample: measured right after a step that raised these messages' likelihood it mostly is);
    ``k3`` (the default) sums ``(r − 1) − log r`` with ``r = π_new/π_cur`` instead (Schulman 2020, "Approximating
    KL Divergence": the same expectation, never negative, 0 only where ``π_new = π_cur`` on every token; the
    log-ratio clamped to ±20)."""
    if estimator == "k1":
        per_token = logp_cur - logp_new
    elif estimator == "k3":
        log_r = (logp_new - logp_cur).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        per_token = log_r.exp() - 1.0 - log_r
    else:
        raise ValueError(f"token_kl: estimator must be one of {', '.join(KL_ESTIMATORS)}, got {estimator!r}")
    per_message = (per_token * mask).sum(-1)
    present = mask.sum(-1) > 0
    if not bool(present.any()):
        return per_message.sum() * 0.0
    return per_message[present].mean()


@dataclass(frozen=True)
class Surrogate:
    """Eq.10's value and its parts: ``objective = clipped − β·kl`` (to maximise; the loss is its negative)."""

    objective: torch.Tensor  # scalar
    clipped: torch.Tensor  # scalar: mean over messages of min(w·Ã, clip(w)·Ã)
    kl: torch.Tensor  # scalar: token_kl(π_cur, π_new)
    ratio: torch.Tensor  # (B,): w(m; s) per message
    clip_frac: float


def teamtr_surrogate(logp_new: torch.Tensor, logp_cur: torch.Tensor, advantages: torch.Tensor,
                     mask: torch.Tensor, *, clip_eps: float, beta: float, kl_estimator: str = "k3"
                     ) -> Surrogate:
    """TeamTR Eq.10: ``L = E_m[min(w Ã, clip(w, 1−ε, 1+ε) Ã)] − β d̂_KL,tok``.

    ``w(m; s) = Π_u π_new(x_u|s,x_<u) / π_cur(x_u|s,x_<u)`` is one ratio per *message* (the product over its
    tokens; its log is clamped to ±20 before ``exp``), ``Ã`` the message's Eq.9 advantage (``(B,)``, or
    ``(B, T)`` broadcast per token: the masked mean of a row is taken), ``d̂`` is :func:`token_kl` (with
    ``kl_estimator``). The mean runs
    over messages (rows with at least one token). ``logp_cur`` is treated as data (detached)."""
    logp_cur = logp_cur.detach()
    m = mask.to(logp_new.dtype)
    present = m.sum(-1) > 0
    if advantages.dim() == logp_new.dim():
        advantages = (advantages * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    adv = advantages.detach().to(logp_new.dtype)
    log_w = ((logp_new - logp_cur) * m).sum(-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    w = log_w.exp()
    unclipped = w * adv
    clipped = w.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv
    per_message = unclipped.minimum(clipped)
    if bool(present.any()):
        surrogate = per_message[present].mean()
        frac = float((clipped < unclipped)[present].float().mean())
    else:
        surrogate, frac = per_message.sum() * 0.0, 0.0
    kl = token_kl(logp_cur, logp_new, m, kl_estimator)
    return Surrogate(surrogate - beta * kl, surrogate, kl, w, frac)


@register_policy_loss("teamtr")
def teamtr_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, *, clip_ratio: float = 0.1, beta: float = 0.0, kl_estimator: str = "k3"
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """TeamTR Eq.10 as a policy loss (``loss = −L``; message-level ratio, token-decomposed KL penalty with weight
    ``beta`` against ``old_logprobs``, which for TeamTR are the pre-update agent's ``π_cur``; ``kl_estimator`` as
    :func:`token_kl`). Default ε 0.1 is the paper's ratio clip. Metrics: ``clip_frac`` (messages), ``token_kl``
    (over the rows given), ``ratio_mean``, ``ratio_max_dev``.

    The team trainer calls it with ``beta=0`` on the messages it trains and adds ``β·d̂`` itself over all of the
    agent's messages (Eq.10's ``d̂`` is Eq.11's, over ``M_j``; slea/trainer/team.py)."""
    import torch  # the inputs are torch tensors already; imported here so looking up algorithms stays torch-free

    s = teamtr_surrogate(logprobs, old_logprobs, advantages, mask, clip_eps=clip_ratio, beta=beta,
                         kl_estimator=kl_estimator)
    with torch.no_grad():
        present = mask.sum(-1) > 0
        w = s.ratio[present] if bool(present.any()) else s.ratio[:0]
        metrics = {"clip_frac": s.clip_frac, "token_kl": float(s.kl),
                   "ratio_mean": float(w.mean()) if w.numel() else 1.0,
                   "ratio_max_dev": float((w - 1.0).abs().max()) if w.numel() else 0.0}
    return -s.objective, metrics


@dataclass(frozen=True)
class BetaDecision:
    """What :func:`adapt_beta` decided: the next ``beta``; ``stop`` the update now; ``within``: ``d̂ ≤ δ``."""

    beta: float
    stop: bool
    within: bool


def adapt_beta(kl: float, delta: float, beta: float, *, steps_done: int, min_steps: int, max_steps: int,
               factor: float, beta_min: float, beta_max: float) -> BetaDecision:
    """The adaptive-β rule of a TeamTR single-agent update (Eq.10's "β adapted until d̂ ≤ δ_i").

    The paper specifies only the goal ("β adapted until d̂ ≤ δ_i"; the schedule is listed
    as unspecified). Our rule, after each optimizer step with the measured ``kl`` = :func:`token_kl`:

    * ``kl > δ``: ``β ← min(β·factor, β_max)`` — the penalty grows, so further steps pull the agent back inside;
    * ``kl < δ/factor``: ``β ← max(β/factor, β_min)`` — well inside the region, the penalty relaxes (as PPO's
      adaptive KL, Schulman et al. 2017 §4, halves/doubles β around a target);
    * otherwise β is kept;
    * ``stop`` once ``min_steps`` steps are done and ``kl ≤ δ``, or at ``max_steps`` whatever ``kl`` is. A caller
      that stops outside the region (``within`` false) restores the agent's last iterate that was inside it (the
      pre-update weights at worst, where ``d̂ = 0``), so an accepted update always satisfies ``d̂ ≤ δ``.
    """
    if delta <= 0 or factor <= 1 or not 0 < beta_min <= beta_max or min_steps < 1 or max_steps < min_steps:
        raise ValueError(f"adapt_beta: need delta > 0, factor > 1, 0 < beta_min <= beta_max and "
                         f"1 <= min_steps <= max_steps (got {delta}, {factor}, {beta_min}, {beta_max}, "
                         f"{min_steps}, {max_steps})")
    within = math.isfinite(kl) and kl <= delta
    if not within:
        nxt = min(beta * factor, beta_max)
    elif kl < delta / factor:
        nxt = max(beta / factor, beta_min)
    else:
        nxt = beta
    nxt = min(max(nxt, beta_min), beta_max)
    stop = (within and steps_done >= min_steps) or steps_done >= max_steps
    return BetaDecision(nxt, stop, within)


@register_algorithm("teamtr", level="trajectory", needs=("team",),
                    defaults={"algorithm.policy_loss": "teamtr", "algorithm.clip_eps": 0.1,
                              "algorithm.skip_zero_advantage": False})
def teamtr(batch: StepBatch, *, a_clip: float = 3.0, eps_norm: float = 1e-6) -> np.ndarray:
    """TeamTR (Xie et al. 2026, Eq.9): the clipped normalised team advantage of each rollout over its task group,
    broadcast to every message (step row) of the rollout; the team return ``R`` includes invalid-action penalties.
    ``a_clip`` and ``ε_norm`` are unspecified in the paper (our defaults: 3 and 1e-6).

    Defaults: Eq.10's expectation runs over all of the agent's messages (``m ~ π̂^{i−1}``), so a message whose
    advantage is 0 still counts in the surrogate's mean (``algorithm.skip_zero_advantage: false``); the trust
    region's d̂ covers every message whatever that setting says."""
    rows = batch.rows
    returns = np.bincount(rows.traj, weights=batch.folded_rewards, minlength=rows.n_traj)
    per_traj = team_advantage(returns, rows.traj_group, a_clip, eps_norm)
    per_row: np.ndarray = per_traj[rows.traj]
    return per_row
