"""The learned critic of the algorithms that need one (``needs={"critic"}``: ``ppo``, ``turn_ppo``).

A linear value head on the policy backbone's last hidden state (:mod:`slea.policy.value`) with its own AdamW
optimizer. It serves the trainer in two calls per iteration:

1. :meth:`Critic.values` — one no-grad forward of the rollout policy, read where the algorithm's level puts its
   states (every response token for ``token``, the turn boundary for ``turn``); the values go into the
   :class:`~slea.algorithms.batch.StepBatch`, and the registered estimator turns rewards + values into
   advantages and regression targets (slea/algorithms/gae.py);
2. :meth:`Critic.update` — ``train.critic_updates`` AdamW steps of ``algorithm.vf_coef · value_loss`` with value
   clipping (``algorithm.value_clip``) on the cached features, against the estimator's returns ``Â + V_old``.

The policy update itself is the ordinary clipped update (slea/trainer/update.py), untouched.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from slea.algorithms.losses import value_loss
from slea.device import model_device
from slea.policy.value import Positions, ValueHead, hidden_size, value_features
from slea.types import Step

if TYPE_CHECKING:
    from slea.config import AlgorithmSection, TrainSection

__all__ = ["Critic"]

log = logging.getLogger(__name__)


# -- the critic ------------------------------------------------------------------------------------------------
class Critic:
    """A value head on the policy backbone (:mod:`slea.policy.value`) with its own AdamW optimizer; ``level``:
    where it reads values, ``"token"`` or ``"turn"`` (the algorithm's level). ``algorithm``: the value loss's
    ``vf_coef`` and ``value_clip``; ``train``: the head's optimizer and updates; ``dtype``: ``model.dtype``."""

    def __init__(self, model, level: str, pad_id: int = 0, *, algorithm: AlgorithmSection, train: TrainSection,
                 dtype: str):
        if level not in ("token", "turn"):
            raise ValueError(f"a critic reads values per token or per turn, not per {level}")
        self.level = cast(Positions, level)
        self.algo = algorithm
        self.train_cfg = train
        self.dtype = dtype
        self.pad_id = pad_id
        self.head = ValueHead(hidden_size(model)).to(model_device(model))  # on the policy's device
        self.optimizer = torch.optim.AdamW(self.head.parameters(), lr=train.critic_lr,
                                           betas=train.betas, weight_decay=0.0)
        self._cache: tuple[list[torch.Tensor], list[np.ndarray]] | None = None
        self._forward_s = 0.0

    @torch.no_grad()
    def values(self, model, rows: list[Step]) -> list[np.ndarray]:
        """The head's values per row at the positions of this critic's level (one per response token, or one
        at the turn boundary); the features are kept for :meth:`update`."""
        t0 = time.perf_counter()
        feats = value_features(model, [r.prompt_ids for r in rows], [r.response_ids for r in rows], self.level,
                               micro_batch=self.train_cfg.micro_batch, dtype=self.dtype, pad_id=self.pad_id)
        self.head.eval()
        vals = [v.double().numpy() for v in (self.head(f).cpu() for f in feats)]
        self._cache = (feats, vals)
        self._forward_s = time.perf_counter() - t0
        return vals

    def update(self, returns: list[np.ndarray] | None) -> dict[str, float]:
        """Fit the head to ``returns`` (the estimator's targets, in the layout of the last :meth:`values`);
        metrics under ``critic/``. A no-op without cached values or targets."""
        cache, self._cache = self._cache, None
        if cache is None or returns is None:
            return {}
        feats_rows, vals = cache
        keep = [i for i, f in enumerate(feats_rows) if len(f)]
        if not keep:
            return {}
        feats = torch.cat([feats_rows[i] for i in keep])
        dev = feats.device
        old = torch.from_numpy(np.concatenate([vals[i] for i in keep])).float().to(dev)
        ret = torch.from_numpy(np.concatenate([np.asarray(returns[i], np.float64).reshape(-1) for i in keep])
                               ).float().to(dev)
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
        from slea.runs.checkpoint import _flatten_optimizer

        opt_t, opt_meta = _flatten_optimizer(self.optimizer)
        tensors = {f"head.{k}": v.detach().cpu().contiguous() for k, v in self.head.state_dict().items()}
        tensors.update({f"optimizer.{k}": v for k, v in opt_t.items()})
        return tensors, {"level": self.level, "optimizer": opt_meta}

    def restore(self, folder, state: dict[str, Any]) -> bool:
        """Load the critic saved in checkpoint ``folder`` (``critic.safetensors`` + ``state["critic"]``);
        without one (a checkpoint of a critic-free run) the head starts afresh, with a warning."""
        from slea.runs.checkpoint import load_critic

        tensors = load_critic(folder) if folder is not None else None
        if tensors is None:
            log.warning("checkpoint %s has no critic; the value head starts at 0", getattr(folder, "name", folder))
            return False
        self.load_state(tensors, state.get("critic") or {})
        return True

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        from slea.runs.checkpoint import _unflatten_optimizer

        if meta.get("level") not in (None, self.level):
            raise ValueError(f"the saved critic reads values per {meta.get('level')}, this run per {self.level}")
        head = {k.removeprefix("head."): v for k, v in tensors.items() if k.startswith("head.")}
        self.head.load_state_dict(head)
        opt = {k.removeprefix("optimizer."): v for k, v in tensors.items() if k.startswith("optimizer.")}
        if "optimizer" in meta:
            self.optimizer.load_state_dict(_unflatten_optimizer(opt, meta["optimizer"]))
