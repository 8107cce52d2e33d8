"""The critic of PPO and Turn-PPO: a linear value head on the policy backbone's last hidden state.

Design (docs/algorithms/ppo.md): the critic shares the policy's backbone but not its gradients. Hidden states
are read once per iteration, under ``no_grad``, from the rollout policy π_old (the same weights that produced
the old log-probs), and the head ``V(s) = w·h(s) + b`` is fitted on them with its own optimizer and learning
rate. So the policy update is untouched (the critic loss never reaches the LoRA adapters), the critic costs
one extra forward per iteration and ``hidden + 1`` parameters, and its state is one small safetensors file.

Where the value is read, for a step row with prompt ``p`` and response ``a_1..a_L`` (left-padded, causal):

* ``positions="token"`` (PPO): ``V(s_j)`` for every response token ``a_j`` is read at the position that
  predicts ``a_j``, i.e. the last prompt token for ``a_1`` and ``a_{j-1}`` after it (verl's
  ``values[:, -L-1:-1]``) — ``L`` values per row;
* ``positions="turn"`` (Turn-PPO): one value per row, at the last prompt token, the turn boundary (the state
  ``s_h`` = history + current observation, before the turn's response).

The head starts at zero (``V ≡ 0``), so the first iteration's advantages are the plain discounted rewards.
"""

from __future__ import annotations

from typing import Literal

import torch

from slea.device import model_device
from slea.policy.generation import autocast, forward_after_prefix, left_pad, shared_prefix

Positions = Literal["token", "turn"]

__all__ = ["ValueHead", "backbone", "hidden_size", "value_features"]


class ValueHead(torch.nn.Module):
    """``V(h) = w·h + b``: a ``torch.nn.Linear(hidden, 1)`` initialised to zero."""

    def __init__(self, hidden: int):
        super().__init__()
        # Built without touching the global RNG: a critic must not change the run's sampling stream, so PPO and
        # the critic-free algorithms of one seed evaluate the untrained policy on identical samples.
        with torch.random.fork_rng(devices=[]):
            self.linear = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear(features.to(self.linear.weight.dtype)).squeeze(-1)


def _base(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def backbone(model):
    """The decoder stack under the LM head (LoRA adapters stay active when the model is a peft model)."""
    base = _base(model)
    if hasattr(base, "get_decoder"):
        dec = base.get_decoder()
        if dec is not None:
            return dec
    return base.model


def hidden_size(model) -> int:
    return int((getattr(model, "config", None) or _base(model).config).hidden_size)


@torch.no_grad()
def value_features(model, prompts: list[list[int]], responses: list[list[int]], positions: Positions, *,
                   micro_batch: int = 8, dtype: str = "float32", pad_id: int = 0,
                   share_prefix: bool = True) -> list[torch.Tensor]:
    """Last-layer hidden states where the values are read: per row a ``(L_i, H)`` float32 tensor
    (``positions="token"``, ``L_i = len(response)``) or ``(1, H)`` (``"turn"``). See the module docstring.

    Only the tokens up to the last position needed are run (the last response token is never input), in
    micro-batches, under the configured autocast precision, without the LM head; with ``share_prefix`` the
    token prefix common to a micro-batch runs once (its KV cache fanned out), with the same result. The features
    stay on the model's device.
    """
    if positions not in ("token", "turn"):
        raise ValueError(f"positions must be 'token' or 'turn', got {positions!r}")
    dec = backbone(model)
    dev = model_device(dec)
    was_training = model.training
    model.eval()
    out: list[torch.Tensor] = []
    try:
        for start in range(0, len(prompts), micro_batch):
            ps, rs = prompts[start:start + micro_batch], responses[start:start + micro_batch]
            if positions == "token":
                seqs = [list(p) + list(r[:-1]) for p, r in zip(ps, rs)]
                keep = [len(r) for r in rs]
            else:
                seqs = [list(p) for p in ps]
                keep = [1] * len(ps)
            if any(not s for s in seqs):
                raise ValueError("a row has an empty prompt: no position to read its value at")
            k = max(max(keep), 1)
            # The prefix common to the rows (system message, example exchange) runs once and its KV cache is
            # fanned out, as in the training forward; it stops before the first position any row reads.
            prefix = 0
            if share_prefix and len(seqs) > 1:
                prefix = min(shared_prefix(seqs), *(len(q) - max(n, 1) for q, n in zip(seqs, keep)))
            ids, attn = left_pad([q[prefix:] for q in seqs], pad_id, dev)
            with autocast(dtype, dev):
                if prefix > 0:
                    hid = forward_after_prefix(dec, seqs[0][:prefix], ids, attn).last_hidden_state
                else:
                    pos = (attn.cumsum(-1) - 1).clamp(min=0)
                    hid = dec(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).last_hidden_state
            hid = hid[:, -k:].float()
            for row, n in zip(hid, keep):
                out.append(row[k - n:].clone() if n else row[:0].clone())
    finally:
        if was_training:
            model.train()
    return out
