"""PPO and Turn-PPO: advantages from a learned critic (GAE) and the critic's own update.

The trainer asks :func:`make_critic` once; it returns ``None`` unless ``algorithm.name`` names an estimator
that needs learned values (registered with a ``value_level``: ``ppo`` → ``"token"``, ``turn_ppo`` →
``"turn"``). With a critic, one iteration is:

1. :meth:`Critic.build_samples` — read the last hidden state of the rollout policy where the values live
   (:func:`slea.policy.value.value_features`), value them with the head, and turn rewards + values into
   advantages: token-level GAE over a trajectory's response tokens for ``ppo`` (:func:`token_advantages`),
   turn-level GAE over its turns for ``turn_ppo`` (:func:`turn_advantages`); optionally whitened over the
   batch; the same :class:`~slea.trainer.update.Sample` rows the critic-free estimators give (``ppo`` fills
   ``token_advantages``);
2. the ordinary clipped policy update (slea/trainer/update.py), untouched;
3. :meth:`Critic.update` — ``train.critic_updates`` AdamW steps (``train.critic_lr``) of
   ``algorithm.vf_coef · value_loss`` with value clipping (``algorithm.value_clip``) on the cached features,
   against the GAE returns ``Â + V_old``.

Token-level layout (``ppo``): the response tokens of a trajectory's turns are laid end to end; the env reward
of turn ``t`` sits on the last token of turn ``t``'s response, every other token has reward 0, and the value
of the next turn's first token bootstraps the previous turn's last token (the observation tokens in between
are not actions, so they are not states of this MDP). After the last turn the bootstrap is 0, also for
trajectories cut by ``env.max_steps`` (as the critic-free estimators treat them).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from slea.algorithms.advantages import compute_advantages, value_level
from slea.algorithms.gae import token_gae
from slea.algorithms.losses import value_loss
from slea.algorithms.rows import index_rows
from slea.policy.value import ValueHead, hidden_size, value_features
from slea.trainer.update import Sample
from slea.types import Step, Trajectory, columns, flatten

__all__ = ["Critic", "assign_advantages", "make_critic", "needs_critic", "token_advantages", "turn_advantages"]


def needs_critic(cfg) -> bool:
    """Whether ``cfg.algorithm.name`` is trained with a learned critic (``ppo``, ``turn_ppo``)."""
    return value_level(cfg.algorithm.name) is not None


def make_critic(cfg, model, pad_id: int = 0) -> Critic | None:
    """A :class:`Critic` for ``ppo``/``turn_ppo``; ``None`` for the critic-free estimators."""
    return Critic(cfg, model, pad_id=pad_id) if needs_critic(cfg) else None


# -- advantages from values: pure functions over step rows ---------------------------------------------------
def turn_advantages(rows: list[Step], values: np.ndarray, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Turn-level GAE (Turn-PPO) per row: ``(advantages, returns)``, ``returns = Â + V`` (the critic target).
    ``values[i]`` is the critic's value at row ``i``'s turn boundary."""
    col = columns(rows)
    v = np.asarray(values, dtype=np.float64)
    adv = compute_advantages("turn_ppo", col["group_ids"], col["traj_ids"], col["steps"], col["rewards"],
                             gamma=gamma, values=v, lam=lam)
    return adv, adv + v


def token_advantages(rows: list[Step], values: list[np.ndarray], gamma: float, lam: float
                     ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Token-level GAE (PPO) per row: ``(advantages, returns)``, each a list with one array per row of the
    row's response length. ``values[i][j]``: the critic's value before response token ``j`` of row ``i``.
    Layout and bootstrapping: see the module docstring."""
    n = len(rows)
    if len(values) != n:
        raise ValueError(f"values has {len(values)} rows, expected {n}")
    lens = [len(r.response_ids) for r in rows]
    for i, (v, k) in enumerate(zip(values, lens)):
        if len(v) != k:
            raise ValueError(f"row {i}: {len(v)} values for {k} response tokens")
    adv_out = [np.zeros(k) for k in lens]
    ret_out = [np.zeros(k) for k in lens]
    if n == 0:
        return adv_out, ret_out
    col = columns(rows)
    idx = index_rows(col["group_ids"], col["traj_ids"], col["steps"])
    totals = [int(sum(lens[i] for i in idx.order[s:s + m])) for s, m in zip(idx.starts, idx.lengths)]
    width = max(max(totals), 1)
    R = np.zeros((idx.n_traj, width))
    V = np.zeros((idx.n_traj, width))
    M = np.zeros((idx.n_traj, width), dtype=bool)
    where: list[tuple[int, int]] = [(0, 0)] * n  # row -> (trajectory, first column)
    for j, (s, m) in enumerate(zip(idx.starts, idx.lengths)):
        pos = 0
        for i in idx.order[s:s + m]:
            k = lens[i]
            where[i] = (j, pos)
            if k:
                V[j, pos:pos + k] = values[i]
                M[j, pos:pos + k] = True
                R[j, pos + k - 1] += rows[i].reward
            elif pos:  # a turn without tokens: its reward lands on the last action token before it
                R[j, pos - 1] += rows[i].reward
            pos += k
    A, G = token_gae(R, V, M, gamma=gamma, lam=lam)
    for i, (j, pos) in enumerate(where):
        k = lens[i]
        adv_out[i] = A[j, pos:pos + k].copy()
        ret_out[i] = G[j, pos:pos + k].copy()
    return adv_out, ret_out


def _whiten(x: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """``(x − mean) / sqrt(var + eps)`` with the unbiased variance (verl ``masked_whiten``)."""
    if x.size == 0:
        return x
    var = float(x.var(ddof=1)) if x.size > 1 else 0.0
    return (x - x.mean()) / math.sqrt(var + eps)


def assign_advantages(rows: list[Step], values: list[np.ndarray], algo_cfg, level: str
                      ) -> tuple[list[Sample], np.ndarray, list[np.ndarray]]:
    """The training rows the trainer gets from the critic's values: ``(samples, row_advantages, targets)``.

    ``values``: per row, the value array the critic read (``level="token"``: one per response token;
    ``"turn"``: one). ``row_advantages``: one float per row (the turn advantage, or the mean of the row's token
    advantages), for logging; ``targets``: per row, the critic's regression targets (the unwhitened GAE
    returns) in the layout of ``values``. ``algorithm.adv_whiten`` whitens the advantages the policy sees
    over the batch (tokens for ``ppo``, rows for ``turn_ppo``); rows without a response, and with
    ``skip_zero_advantage`` rows whose advantages are all 0, give no sample.
    """
    a = algo_cfg
    if level == "turn":
        v = np.array([float(np.asarray(x).reshape(-1)[0]) for x in values], dtype=np.float64)
        adv, ret = turn_advantages(rows, v, a.turn_gamma, a.turn_lambda)
        pol = _whiten(adv) if a.adv_whiten else adv
        samples = [Sample(r.prompt_ids, r.response_ids, r.old_logprobs, float(x))
                   for r, x in zip(rows, pol)
                   if r.response_ids and not (a.skip_zero_advantage and abs(x) < 1e-8)]
        return samples, pol, [np.array([t]) for t in ret]
    if level != "token":
        raise ValueError(f"unknown value level {level!r}")
    adv_t, ret_t = token_advantages(rows, [np.asarray(x, dtype=np.float64) for x in values], a.gae_gamma,
                                    a.gae_lambda)
    if a.adv_whiten and rows:
        flat = _whiten(np.concatenate(adv_t)) if any(len(x) for x in adv_t) else np.zeros(0)
        cuts = np.cumsum([len(x) for x in adv_t])[:-1]
        adv_t = list(np.split(flat, cuts))
    row_adv = np.array([float(x.mean()) if len(x) else 0.0 for x in adv_t])
    samples = [Sample(r.prompt_ids, r.response_ids, r.old_logprobs, float(x.mean()), token_advantages=x.tolist())
               for r, x in zip(rows, adv_t)
               if r.response_ids and not (a.skip_zero_advantage and np.all(np.abs(x) < 1e-8))]
    return samples, row_adv, ret_t


# -- the critic ------------------------------------------------------------------------------------------------
class Critic:
    """A value head on the policy backbone (:mod:`slea.policy.value`) with its own AdamW optimizer."""

    def __init__(self, cfg, model, pad_id: int = 0):
        level = value_level(cfg.algorithm.name)
        if level is None:
            raise ValueError(f"algorithm {cfg.algorithm.name!r} does not use a learned critic")
        self.level = level
        self.algo = cfg.algorithm
        self.train_cfg = cfg.train
        self.dtype = cfg.model.dtype
        self.pad_id = pad_id
        self.head = ValueHead(hidden_size(model))
        self.optimizer = torch.optim.AdamW(self.head.parameters(), lr=cfg.train.critic_lr,
                                           betas=tuple(cfg.train.betas), weight_decay=0.0)
        self._batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._forward_s = 0.0

    @torch.no_grad()
    def values(self, model, rows: list[Step]) -> tuple[list[torch.Tensor], list[np.ndarray]]:
        """``(features, values)`` per row at the positions of this critic's level."""
        feats = value_features(model, [r.prompt_ids for r in rows], [r.response_ids for r in rows], self.level,
                               micro_batch=self.train_cfg.micro_batch, dtype=self.dtype, pad_id=self.pad_id)
        self.head.eval()
        vals = [self.head(f).double().numpy() for f in feats]
        return feats, vals

    def build_samples(self, model, trajs: list[Trajectory]) -> tuple[list[Sample], np.ndarray]:
        """Training rows with GAE advantages (the critic-based counterpart of ``rl.build_samples``); caches
        the features, old values and returns for :meth:`update`."""
        rows = flatten(trajs)
        if not rows:
            self._batch = None
            return [], np.zeros(0)
        t0 = time.perf_counter()
        feats, vals = self.values(model, rows)
        self._forward_s = time.perf_counter() - t0
        samples, row_adv, targets = assign_advantages(rows, vals, self.algo, self.level)
        keep = [i for i, f in enumerate(feats) if len(f)]
        if keep:
            self._batch = (torch.cat([feats[i] for i in keep]),
                           torch.from_numpy(np.concatenate([vals[i] for i in keep])).float(),
                           torch.from_numpy(np.concatenate([targets[i] for i in keep])).float())
        else:
            self._batch = None
        return samples, row_adv

    def update(self) -> dict[str, float]:
        """Fit the head to the cached returns; metrics under ``critic/``. A no-op without a cached batch."""
        if self._batch is None:
            return {}
        feats, old, ret = self._batch
        self._batch = None
        t0 = time.perf_counter()
        mask = torch.ones_like(ret)
        self.head.train()
        first: dict[str, float] = {}
        loss_v = 0.0
        for step in range(self.train_cfg.critic_updates):
            v = self.head(feats)
            loss, met = value_loss(v, old, ret, mask, clip=self.algo.value_clip)
            self.optimizer.zero_grad(set_to_none=True)
            (self.algo.vf_coef * loss).backward()
            torch.nn.utils.clip_grad_norm_(self.head.parameters(), self.train_cfg.grad_clip)
            self.optimizer.step()
            loss_v = float(loss.detach())
            if step == 0:
                first = {"vf_loss_first": loss_v, "vf_mse_old": met["vf_mse"]}
            clip_frac = met["vf_clip_frac"]
        with torch.no_grad():
            new = self.head(feats)
        var_ret = float(ret.var()) if ret.numel() > 1 else 0.0
        explained = 1.0 - float((ret - old).var()) / var_ret if var_ret > 1e-12 else 0.0
        return {**first, "vf_loss": loss_v, "vf_clip_frac": clip_frac, "explained_var": explained,
                "values_mean": float(old.mean()), "values_new_mean": float(new.mean()),
                "returns_mean": float(ret.mean()), "positions": float(ret.numel()),
                "forward_s": self._forward_s, "update_s": time.perf_counter() - t0}

    # -- checkpoint ------------------------------------------------------------------------------------------
    def state_tensors(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """``(tensors, meta)``: the head's weights and its optimizer as safetensors-ready tensors plus JSON."""
        from slea.trainer.checkpoint import _flatten_optimizer

        opt_t, opt_meta = _flatten_optimizer(self.optimizer)
        tensors = {f"head.{k}": v.detach().cpu().contiguous() for k, v in self.head.state_dict().items()}
        tensors.update({f"optimizer.{k}": v for k, v in opt_t.items()})
        return tensors, {"level": self.level, "optimizer": opt_meta}

    def restore(self, folder, state: dict[str, Any], warn=None) -> bool:
        """Load the critic saved in checkpoint ``folder`` (``critic.safetensors`` + ``state["critic"]``);
        without one (a checkpoint of a critic-free run) the head starts afresh, with a warning."""
        from slea.trainer.checkpoint import load_critic

        tensors = load_critic(folder) if folder is not None else None
        if tensors is None:
            if warn is not None:
                warn(f"warning: checkpoint {getattr(folder, 'name', folder)} has no critic; the value head starts at 0")
            return False
        self.load_state(tensors, state.get("critic") or {})
        return True

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        from slea.trainer.checkpoint import _unflatten_optimizer

        if meta.get("level") not in (None, self.level):
            raise ValueError(f"the saved critic reads values per {meta.get('level')}, this run per {self.level}")
        head = {k.removeprefix("head."): v for k, v in tensors.items() if k.startswith("head.")}
        self.head.load_state_dict(head)
        opt = {k.removeprefix("optimizer."): v for k, v in tensors.items() if k.startswith("optimizer.")}
        if "optimizer" in meta:
            self.optimizer.load_state_dict(_unflatten_optimizer(opt, meta["optimizer"]))
