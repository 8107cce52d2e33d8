"""Generalised advantage estimation (Schulman et al. 2016, "High-Dimensional Continuous Control Using GAE"), and
the two critic-based algorithms built on it: ``ppo`` (token level) and ``turn_ppo`` (turn level).

Eq. 16: ``δ_t = r_t + γ V(s_{t+1}) − V(s_t)``, ``Â_t = Σ_l (γλ)^l δ_{t+l}``, computed by the backward recursion
``Â_t = δ_t + γλ Â_{t+1}``; the value target is ``Â_t + V(s_t)``.

* :func:`gae` — token level over ``(B, T)`` arrays (verl ``compute_gae_advantage_return``): positions with
  ``mask = 0`` (padding, or observation tokens between turns) are skipped: the recursion passes through them, so
  the next response token's value and advantage bootstrap the previous one. Their own outputs are 0.
* :func:`turn_gae` — turn level over flat step rows (Turn-PPO, Li et al. 2025, arXiv 2512.17008): one state per
  row (the value read at the turn boundary); bootstrap 0 after the last turn of every trajectory. Vectorised
  over trajectories by turn index.

Token layout of ``ppo`` (:func:`trajectory_token_gae`): the response tokens of a trajectory's turns are laid end
to end; the env reward of turn ``t`` sits on the last token of turn ``t``'s response, every other token has
reward 0, and the value of the next turn's first token bootstraps the previous turn's last token (the
observation tokens in between are not actions, so they are not states of this MDP). After the last turn the
bootstrap is 0, also for trajectories cut by ``env.max_steps`` (as the critic-free estimators treat them).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from slea.algorithms.advantages import whiten
from slea.algorithms.batch import Advantages, StepBatch
from slea.algorithms.registry import register_algorithm
from slea.algorithms.rows import RowIndex, index_rows

__all__ = ["gae", "token_gae", "trajectory_token_gae", "turn_gae"]

WHITEN_EPS = 1e-8  # verl masked_whiten


def _check(gamma: float, lam: float) -> None:
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma and lam must be in [0, 1]; got {gamma}, {lam}")


def gae(rewards: Any, values: Any, mask: Any, gamma: float = 1.0, lam: float = 0.95) -> tuple[Any, Any]:
    """Token-level GAE. Returns ``(advantages, returns)``, each ``(B, T)``: numpy arrays, or torch tensors (on
    ``rewards``' device) when ``rewards`` is one; entries where ``mask`` is 0 are 0. Not whitened."""
    as_torch = type(rewards).__module__.startswith("torch")
    r = np.asarray(rewards.detach().cpu() if as_torch else rewards, dtype=np.float64)
    v = np.asarray(values.detach().cpu() if hasattr(values, "detach") else values, dtype=np.float64)
    m = np.asarray(mask.cpu() if hasattr(mask, "cpu") else mask).astype(bool)
    if r.shape != v.shape or r.shape != m.shape or r.ndim != 2:
        raise ValueError(f"rewards, values and mask must share one (B, T) shape; got {r.shape}, {v.shape}, {m.shape}")
    _check(gamma, lam)
    B, T = r.shape
    adv = np.zeros_like(r)
    next_value = np.zeros(B)
    last = np.zeros(B)
    for t in range(T - 1, -1, -1):
        mt = m[:, t]
        a = r[:, t] + gamma * next_value - v[:, t] + gamma * lam * last
        adv[:, t] = np.where(mt, a, 0.0)
        next_value = np.where(mt, v[:, t], next_value)
        last = np.where(mt, a, last)
    ret = np.where(m, adv + v, 0.0)
    if as_torch:
        import torch

        dtype = rewards.dtype if rewards.is_floating_point() else torch.float64
        return (torch.as_tensor(adv, dtype=dtype, device=rewards.device),
                torch.as_tensor(ret, dtype=dtype, device=rewards.device))
    return adv, ret


token_gae = gae  # the package exports this name: ``slea.algorithms.gae`` is the module


def _turn_gae(rows: RowIndex, rewards: np.ndarray, values: np.ndarray, gamma: float, lam: float
              ) -> tuple[np.ndarray, np.ndarray]:
    delta = rewards + gamma * rows.next_in_traj(values, 0.0) - values
    adv = rows.reverse_scan(delta, gamma * lam)
    return adv, adv + values


def turn_gae(traj_ids: Any, steps: Any, rewards: Any, values: Any, gamma: float = 0.99, lam: float = 0.9,
             group_ids: Any | None = None) -> tuple[np.ndarray, np.ndarray]:
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
    _check(gamma, lam)
    return _turn_gae(rows, r, v, gamma, lam)


def trajectory_token_gae(rows: RowIndex, rewards: np.ndarray, lengths: np.ndarray, values: list[np.ndarray],
                         gamma: float, lam: float) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Token-level GAE per step row (layout: module docstring): ``(advantages, returns)``, each a list with one
    array per row of the row's response length. ``values[i][j]``: the critic's value before response token
    ``j`` of row ``i``."""
    _check(gamma, lam)
    lens = [int(k) for k in lengths]
    for i, (v, k) in enumerate(zip(values, lens)):
        if len(v) != k:
            raise ValueError(f"row {i}: {len(v)} values for {k} response tokens")
    adv_out = [np.zeros(k) for k in lens]
    ret_out = [np.zeros(k) for k in lens]
    if rows.n == 0:
        return adv_out, ret_out
    totals = [int(sum(lens[i] for i in rows.order[s:s + m])) for s, m in zip(rows.starts, rows.lengths)]
    width = max(max(totals), 1)
    R = np.zeros((rows.n_traj, width))
    V = np.zeros((rows.n_traj, width))
    M = np.zeros((rows.n_traj, width), dtype=bool)
    where: list[tuple[int, int]] = [(0, 0)] * rows.n  # row -> (trajectory, first column)
    for j, (s, m) in enumerate(zip(rows.starts, rows.lengths)):
        pos = 0
        for i in rows.order[s:s + m]:
            k = lens[i]
            where[i] = (j, pos)
            if k:
                V[j, pos:pos + k] = values[i]
                M[j, pos:pos + k] = True
                R[j, pos + k - 1] += rewards[i]
            elif pos:  # a turn without tokens: its reward lands on the last action token before it
                R[j, pos - 1] += rewards[i]
            pos += k
    A, G = gae(R, V, M, gamma=gamma, lam=lam)
    for i, (j, pos) in enumerate(where):
        adv_out[i] = A[j, pos:pos + lens[i]].copy()
        ret_out[i] = G[j, pos:pos + lens[i]].copy()
    return adv_out, ret_out


def _critic_values(batch: StepBatch) -> list[np.ndarray]:
    return [np.asarray(v, dtype=np.float64).reshape(-1) for v in batch.column("values", "the critic's values")]


@register_algorithm("ppo", level="token", needs=("critic",))
def ppo(batch: StepBatch, *, gae_gamma: float, gae_lambda: float, adv_whiten: bool) -> Advantages:
    """PPO with token-level GAE (Schulman et al. 2017; GAE 2016 Eq. 16; Ouyang et al. 2022 for LLMs): one
    advantage per response token from the critic's value before each token (layout: module docstring);
    ``adv_whiten`` whitens the policy's advantages over the batch's tokens (the critic's targets stay raw).
    Invalid-action penalties are part of the rewards the critic learns (a value function has no "after
    discounting" place for them)."""
    lengths = batch.column("response_lengths", "response lengths")
    adv_t, ret_t = trajectory_token_gae(batch.rows, batch.folded_rewards, lengths, _critic_values(batch), gae_gamma,
                                        gae_lambda)
    if adv_whiten and any(len(x) for x in adv_t):
        flat = whiten(np.concatenate(adv_t), eps=WHITEN_EPS)
        adv_t = list(np.split(flat, np.cumsum([len(x) for x in adv_t])[:-1]))
    rows = np.array([float(x.mean()) if len(x) else 0.0 for x in adv_t])
    return Advantages(rows, tokens=adv_t, returns=ret_t)


@register_algorithm("turn_ppo", level="turn", needs=("critic",))
def turn_ppo(batch: StepBatch, *, turn_gamma: float, turn_lambda: float, adv_whiten: bool) -> Advantages:
    """Turn-PPO (Li et al. 2025, arXiv 2512.17008): turn-level GAE with one state per turn,
    ``δ_t = r_t + γ V_{t+1} − V_t`` (``V`` = 0 after the last turn), ``Â_t = δ_t + γλ Â_{t+1}``, from the critic's
    value at each row's turn boundary (the last prompt token); ``adv_whiten`` whitens over the batch's rows."""
    _check(turn_gamma, turn_lambda)
    v = np.array([x[0] if len(x) else 0.0 for x in _critic_values(batch)])
    adv, ret = _turn_gae(batch.rows, batch.folded_rewards, v, float(turn_gamma), float(turn_lambda))
    return Advantages(whiten(adv, eps=WHITEN_EPS) if adv_whiten else adv, returns=[np.array([x]) for x in ret])
