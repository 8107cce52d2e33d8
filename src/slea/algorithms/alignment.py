"""Offline alignment objectives: SFT, DPO, turn-weighted DPO, DIL/DRE and tlm-DRE, as small pure functions.

Papers:

* tlm-DRE — Zhao, Chen, Li, Liu, "Turn-level Multiscale Density Ratio Estimation" (Eq.8–10, 16, 17);
* DIL — Xiao et al., ICLR 2025, "On a connection between imitation learning and RLHF" (Eq.3–5, App. A kernels);
* DPO — Rafailov et al. 2023, Eq.7; ETO (Song et al. 2024) pairs an expert trajectory with a failed one.

Notation. A trajectory's *action turns* ``y_i`` are the tokens the agent generated at turn ``i`` (observations
are the environment's and are treated as deterministic). The per-turn *log-ratio* is
``u_i = Σ_j log π_θ(y_{i,j}) − log π_ref(y_{i,j})`` (a sum over the turn's action tokens), a trajectory's is
``Σ_i u_i``. ``w`` marks the chosen (expert) trajectory, ``l`` the rejected (failed) one; ``r = π_θ/π_ref``.

Everything is computed in log space: a ratio of probabilities is ``exp`` of a difference of log-probs, a product
over turns is ``exp`` of a sum, so no product of probabilities is ever formed (40 turns at log-prob −30 are
``e^−1200``, 0 in float64, and a literal ``Π π_θ / Π π_ref`` would be ``0/0``).

The numpy functions (Eq.9, Eq.10) compute constants from the frozen reference; the torch functions take
log-ratio tensors and return one loss per pair (the caller averages). Gradient flows only through
``log π_θ``; every quantity built from ``π_ref`` (the weights ω, the adequacy p, the importance factor of
Eq.16) is a constant: the reference is frozen, and the functions below ``detach`` them to make that explicit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "CHOSEN_FACTORS",
    "KERNELS",
    "bregman_terms",
    "chosen_log_factor",
    "dil_loss",
    "dpo_loss",
    "multiscale_logratio",
    "sft_nll",
    "tlm_dre_loss",
    "turn_adequacy",
    "turn_dpo_loss",
    "turn_weights",
]

KERNELS = ("ukl", "lsif", "bce", "basu")
CHOSEN_FACTORS = ("mean", "turn", "none")


def turn_adequacy(turn_logprobs: Sequence[np.ndarray]) -> np.ndarray:
    """tlm-DRE Eq.9: the reference policy's adequacy ``p_i`` of each action turn.

    ``log p_i = (1/|y_i|) Σ_j log π_ref(y_{i,j} | x, c_{i−1}, y_{i,<j})`` — the exp of the *mean* token log-prob
    (a geometric-mean token probability, in (0, 1]), taken as a mean of logs so a long or unlikely turn does not
    underflow. ``turn_logprobs``: one array of token log-probs per turn. An empty turn is a ``ValueError``.
    """
    means = []
    for i, lp in enumerate(turn_logprobs):
        lp = np.asarray(lp, dtype=np.float64)
        if lp.size == 0:
            raise ValueError(f"turn {i} has no action tokens: its adequacy (Eq.9) is undefined")
        means.append(lp.mean())
    return np.exp(np.asarray(means, dtype=np.float64))


def turn_weights(p: np.ndarray, pivot: float = 0.9, omega_low: float = 0.2, omega_high: float = 1.0) -> np.ndarray:
    """tlm-DRE Eq.10: ``ω_i = ω_L`` where ``p_i > p_pivot`` (a turn the reference is sure of), ``ω_U`` where
    ``p_i ≤ p_pivot`` (the turn at the pivot itself is uncertain). Paper defaults: ``p_pivot = 0.9``,
    ``ω_L = 0.2`` (best of {0, .2, .4, .6}), ``ω_U = 1``."""
    p = np.asarray(p, dtype=np.float64)
    return np.where(p > pivot, omega_low, omega_high).astype(np.float64)


def dpo_loss(chosen_logratio: torch.Tensor, rejected_logratio: torch.Tensor, beta: float = 0.1) -> torch.Tensor:
    """DPO (Rafailov et al. 2023, Eq.7), per pair: ``−log σ(β · (u_w − u_l))``, with ``u`` a trajectory's
    log-ratio (summed over its action tokens). ETO's objective when ``w`` is the expert and ``l`` a failure.
    Computed as ``−logsigmoid`` (stable for any margin)."""
    return -F.logsigmoid(beta * (chosen_logratio - rejected_logratio))


def multiscale_logratio(turn_logratios: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """tlm-DRE Eq.8 in log space: ``log r̂(y) = Σ_i ω_i · u_i`` for ``r̂ = Π_i (π_θ(y_i)/π_ref(y_i))^{ω_i}``.

    ``turn_logratios``, ``weights``: ``(B, T)``, padded with zeros (a padded turn has ω = 0 and adds nothing).
    The weights are constants (``detach``)."""
    return (weights.detach() * turn_logratios).sum(-1)


def sft_nll(token_logprob_sums: torch.Tensor, token_counts: torch.Tensor) -> torch.Tensor:
    """Behaviour cloning (the SFT stage of ETO and tlm-DRE, T-paper §5): the negative log-likelihood of the expert
    action tokens, averaged over tokens: ``−Σ log π_θ / Σ |y|`` (inputs are per-turn sums and token counts)."""
    return -token_logprob_sums.sum() / token_counts.sum().clamp(min=1)


def turn_dpo_loss(chosen_turn_logratio: torch.Tensor, rejected_turn_logratio: torch.Tensor,
                  chosen_weights: torch.Tensor, rejected_weights: torch.Tensor, beta: float = 0.1) -> torch.Tensor:
    """Linearly turn-weighted DPO ("tlm-DRE w/o DRE", T-paper Table 1): DPO on the multiscale log-ratios of
    Eq.8, ``−log σ(β · (Σ_i ω_{w,i} u_{w,i} − Σ_i ω_{l,i} u_{l,i}))``, per pair; ``(B, T)`` zero-padded inputs."""
    return dpo_loss(multiscale_logratio(chosen_turn_logratio, chosen_weights),
                    multiscale_logratio(rejected_turn_logratio, rejected_weights), beta)


def bregman_terms(log_r: torch.Tensor, kernel: str = "ukl", alpha: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """The two pieces of the DIL loss for a kernel ``f``, as functions of ``s = log r``:
    ``(∂f(r), r·∂f(r) − f(r))``. Kernels (DIL App. A; algebra written out here, every form exact):

    * ``ukl``  ``f = r log r − r``:            ``∂f = s``,                     ``r∂f − f = e^s``;
    * ``lsif`` ``f = ½(r − 1)²``:               ``∂f = e^s − 1``,               ``r∂f − f = ½(e^{2s} − 1)``;
    * ``bce``  ``f = r log r − (r+1) log(r+1)``: ``∂f = log σ(s)``,             ``r∂f − f = log(1 + e^s)``;
    * ``basu`` ``f = (r^{1+α} − r)/α``:        ``∂f = ((1+α) e^{αs} − 1)/α``,   ``r∂f − f = e^{(1+α)s}``.

    ``bce`` uses ``logsigmoid``/``softplus``; the others ``exp``/``expm1`` of ``s`` (finite for ``s`` below
    ~88 in float32: a policy that far above its reference on a pair is already diverged)."""
    if kernel == "ukl":
        return log_r, torch.exp(log_r)
    if kernel == "lsif":
        return torch.expm1(log_r), 0.5 * torch.expm1(2 * log_r)
    if kernel == "bce":
        return F.logsigmoid(log_r), F.softplus(log_r)
    if kernel == "basu":
        if alpha <= 0:
            raise ValueError(f"the Basu kernel needs alpha > 0, got {alpha}")
        return ((1 + alpha) * torch.exp(alpha * log_r) - 1) / alpha, torch.exp((1 + alpha) * log_r)
    raise ValueError(f"unknown DIL kernel {kernel!r}; known: {', '.join(KERNELS)}")


def dil_loss(chosen_logratio: torch.Tensor, rejected_logratio: torch.Tensor, kernel: str = "ukl", *,
             alpha: float = 0.5, chosen_log_weight: torch.Tensor | None = None) -> torch.Tensor:
    """DIL (Xiao et al. 2025, Eq.5) / tlm-DRE Eq.16, per pair:
    ``L = [r_l ∂f(r_l) − f(r_l)] − c_w · ∂f(r_w)`` with ``r = exp(log-ratio)``.

    Without ``chosen_log_weight`` (``c_w = 1``) this is DIL, "tlm-DRE w/o tlm": UKL gives ``r_l − log r_w``,
    LSIF ``½ r_l² − r_w`` (+ ½), BCE ``−log σ(log r_w) − log σ(−log r_l)``, Basu-α
    ``r_l^{1+α} − ((1+α) r_w^α − 1)/α``. ``chosen_log_weight``: ``log c_w`` per pair (tlm-DRE's importance factor,
    :func:`chosen_log_factor`), a constant (detached); ``c_w`` is ``exp`` of it, which can only shrink towards 0,
    never overflow or turn into NaN. See :func:`bregman_terms` for the kernels, ``alpha`` for Basu."""
    df_w, _ = bregman_terms(chosen_logratio, kernel, alpha)
    _, conj_l = bregman_terms(rejected_logratio, kernel, alpha)
    if chosen_log_weight is not None:
        df_w = torch.exp(chosen_log_weight.detach()) * df_w
    return conj_l - df_w


def chosen_log_factor(ref_turn_logprobs: torch.Tensor, weights: torch.Tensor, token_counts: torch.Tensor,
                      reading: str = "mean") -> torch.Tensor:
    """``log c_w``, the log of tlm-DRE Eq.16's factor on the chosen term, ``c_w = Π_i π_ref^{1−ω_i}(y_{w,i})``
    (printed in Eq.17 as ``1 / Π_{i'} π_ref^{ω_{i'}−1}``), per pair; ``(B, T)`` zero-padded inputs.

    It comes from the assumption ``π_c(y_w) ≈ 1`` (the expert turn is certain under the target policy). What
    ``π_ref(y_{w,i})`` of a whole turn means is not stated (papers.md §3.4); ``reading``:

    * ``"mean"`` (default): the per-token geometric-mean probability ``p_i`` of Eq.9, the same normalisation the
      paper uses to decide which turns are adequate: ``log c_w = Σ_i (1 − ω_i) · log p_i``. With ``ω_U = 1`` only
      turns above the pivot contribute, each at least ``p_pivot^{1−ω_L}``, so ``c_w ≥ 0.9^{0.8·n}`` for ``n``
      turns: the chosen term keeps its weight on long trajectories.
    * ``"turn"`` (the literal Eq.17): whole-turn probabilities, ``log c_w = Σ_i (1 − ω_i) · Σ_j log π_ref(y_{i,j})``.
      Summed in log space it never produces NaN, but a turn of ``n`` tokens at per-token probability ``p``
      contributes ``p^{n(1−ω)}``: on a long expert trajectory ``c_w`` goes to 0 and the loss keeps only its
      rejected term.
    * ``"none"``: ``c_w = 1`` (drop the factor; the chosen term is then DIL's with the multiscale ratio).

    A constant: built from ``π_ref`` only, returned detached."""
    if reading == "none":
        return torch.zeros(ref_turn_logprobs.shape[:-1], dtype=ref_turn_logprobs.dtype,
                           device=ref_turn_logprobs.device)
    if reading == "mean":
        per_turn = ref_turn_logprobs / token_counts.clamp(min=1)
    elif reading == "turn":
        per_turn = ref_turn_logprobs
    else:
        raise ValueError(f"unknown chosen_factor {reading!r}; known: {', '.join(CHOSEN_FACTORS)}")
    return ((1 - weights) * per_turn).sum(-1).detach()


def tlm_dre_loss(chosen_turn_logratio: torch.Tensor, rejected_turn_logratio: torch.Tensor,
                 chosen_weights: torch.Tensor, rejected_weights: torch.Tensor,
                 chosen_ref_logprobs: torch.Tensor, chosen_token_counts: torch.Tensor, *,
                 kernel: str = "ukl", alpha: float = 0.5, chosen_factor: str = "mean") -> torch.Tensor:
    """tlm-DRE, T-paper Eq.16 (Eq.17 for the UKL kernel), per pair, in log space:

    ``L = [r̂_l ∂f(r̂_l) − f(r̂_l)] − c_w · ∂f(r̂_w)``,  ``log r̂ = Σ_i ω_i u_i`` (Eq.8),
    ``c_w = Π_i π_ref^{1−ω_i}(y_{w,i})`` (:func:`chosen_log_factor`).

    With UKL this is Eq.17, ``exp(Σ_i ω_{l,i} u_{l,i}) − c_w · Σ_i ω_{w,i} u_{w,i}``: the rejected trajectory
    enters through the exponential of its weighted log-ratio sum, the expert linearly through its weighted
    per-turn log-ratios (the "asymmetric" form).

    Reading of the printed Eq.17 (ambiguous, papers.md §3.4): the ratio products are sums of weighted log-ratios
    (never products of probabilities); ``π_ref`` of a turn inside ``c_w`` is the per-token geometric mean ``p_i``
    of Eq.9 by default (``chosen_factor="mean"``), whole-turn as printed with ``chosen_factor="turn"``, or the
    factor is dropped with ``"none"``; ω is computed with the same pivot for chosen and rejected turns (by the
    caller, :func:`turn_weights`). No β: the paper puts no temperature on the ratio.

    Stop-gradients: ω (Eq.10), ``c_w`` and every ``π_ref`` term are constants (the reference is frozen); the
    gradient flows through ``log π_θ`` inside ``u`` only. With UKL: ``∂L/∂u_{w,i} = −c_w ω_{w,i}`` and
    ``∂L/∂u_{l,i} = ω_{l,i} r̂_l``.

    Inputs are ``(B, T_w)`` / ``(B, T_l)``, zero-padded (padded turns: weight 0, log-prob 0, 0 tokens).
    """
    log_c = chosen_log_factor(chosen_ref_logprobs, chosen_weights, chosen_token_counts, chosen_factor)
    return dil_loss(multiscale_logratio(chosen_turn_logratio, chosen_weights),
                    multiscale_logratio(rejected_turn_logratio, rejected_weights),
                    kernel, alpha=alpha, chosen_log_weight=log_c)
