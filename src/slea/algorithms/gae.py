"""Generalised advantage estimation (Schulman et al. 2016, "High-Dimensional Continuous Control Using GAE").

Eq. 16: ``δ_t = r_t + γ V(s_{t+1}) − V(s_t)``, ``Â_t = Σ_l (γλ)^l δ_{t+l}``, computed by the backward recursion
``Â_t = δ_t + γλ Â_{t+1}``; the value target is ``Â_t + V(s_t)``.

* :func:`gae` — token level (PPO for LLMs, verl ``compute_gae_advantage_return``): one state per response
  token, ``(B, T)`` tensors or arrays; positions with ``mask = 0`` (padding, or observation tokens between
  turns in a multi-turn sequence) are skipped: the recursion passes through them, so the next response token's
  value and advantage bootstrap the previous one. Their own outputs are 0.
* :func:`turn_gae` — turn level (Turn-PPO, Li et al. 2025, arXiv 2512.17008): one state per step row (the
  value read at the turn boundary), over flat step rows like the advantage estimators; bootstrap 0 after the
  last turn of every trajectory. Vectorised over trajectories by turn index (no per-row Python loop).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from slea.algorithms.rows import index_rows

__all__ = ["gae", "masked_whiten", "token_gae", "turn_gae"]


def gae(rewards: Any, values: Any, mask: Any, gamma: float = 1.0, lam: float = 0.95) -> tuple[Any, Any]:
    """Token-level GAE. Returns ``(advantages, returns)``, each ``(B, T)``, of the input's kind (torch tensors
    or numpy arrays); entries where ``mask`` is 0 are 0. Not whitened (see :func:`masked_whiten`)."""
    as_numpy = isinstance(rewards, np.ndarray)
    r = torch.as_tensor(rewards)
    dtype = r.dtype if r.is_floating_point() else torch.float64
    r = r.to(dtype)
    v = torch.as_tensor(values).to(dtype=dtype, device=r.device).detach()
    m = torch.as_tensor(mask).to(device=r.device).bool()
    if r.shape != v.shape or r.shape != m.shape or r.dim() != 2:
        raise ValueError(
            f"rewards, values and mask must share one (B, T) shape; got {r.shape}, {v.shape}, {m.shape}"
        )
    with torch.no_grad():
        B, T = r.shape
        adv = torch.zeros_like(r)
        next_value = torch.zeros(B, dtype=dtype, device=r.device)
        last = torch.zeros(B, dtype=dtype, device=r.device)
        for t in range(T - 1, -1, -1):
            mt = m[:, t]
            delta = r[:, t] + gamma * next_value - v[:, t]
            a = delta + gamma * lam * last
            adv[:, t] = torch.where(mt, a, torch.zeros_like(a))
            next_value = torch.where(mt, v[:, t], next_value)
            last = torch.where(mt, a, last)
        ret = torch.where(m, adv + v, torch.zeros_like(adv))
    if as_numpy:
        return adv.numpy(), ret.numpy()
    return adv, ret


token_gae = gae  # the package exports this name: ``slea.algorithms.gae`` is the module


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8):
    """``(x − mean) / sqrt(var + eps)`` over the masked entries (unbiased var), as verl ``masked_whiten``;
    with ``shift_mean=False`` the mean is added back (only the scale changes)."""
    m = mask.to(values.dtype)
    n = m.sum()
    mean = (values * m).sum() / n.clamp(min=1.0)
    var = (((values - mean) ** 2) * m).sum() / (n - 1).clamp(min=1.0)
    out = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out


def turn_gae(
    traj_ids: Any,
    steps: Any,
    rewards: Any,
    values: Any,
    gamma: float = 0.99,
    lam: float = 0.9,
    group_ids: Any | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Turn-level GAE over step rows (Turn-PPO): per row ``δ_t = r_t + γ V_{t+1} − V_t`` with ``V_{T} = 0``
    after a trajectory's last turn, ``Â_t = δ_t + γλ Â_{t+1}``. Returns ``(advantages, returns)`` float64 per
    row, in input row order (``returns = Â + V``, the critic's target). A trajectory is a ``traj_id`` (or a
    ``(group_id, traj_id)`` pair); rows are ordered by ``steps``. Turn-PPO's suggested γ≈0.99, λ≈0.9.
    """
    t = np.asarray(traj_ids)
    rows = index_rows(np.zeros(len(t), np.int64) if group_ids is None else group_ids, t, steps)
    r = np.asarray(rewards, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if r.shape != (rows.n,) or v.shape != (rows.n,):
        raise ValueError(f"rewards and values must have shape ({rows.n},); got {r.shape}, {v.shape}")
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma and lam must be in [0, 1]; got {gamma}, {lam}")
    delta = r + gamma * rows.next_in_traj(v, 0.0) - v
    adv = rows.reverse_scan(delta, gamma * lam)
    return adv, adv + v
