"""Batched generation with the log-probabilities the policy ratio needs.

One call generates for every live env of a turn. Rows are left-padded; a row stops at EOS or at the first
token that contains a newline (the answer is one command on one line). The returned log-probs are
``log_softmax(logits / T)`` of the sampled tokens, the same quantity the training forward computes, so
the PPO ratio starts near 1 (the remaining gap is generation vs. training numerics; it is reported).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import lru_cache

import torch


@dataclass
class Generation:
    ids: list[int]
    logprobs: list[float]
    text: str


def autocast(dtype: str):
    if dtype == "bfloat16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@lru_cache(maxsize=8)
def _newline_ids(tokenizer) -> frozenset[int]:
    vocab = tokenizer.get_vocab()
    ids = set()
    for tid in vocab.values():
        if "\n" in tokenizer.decode([tid]):
            ids.add(tid)
    return frozenset(ids)


class _StopAtLineEnd:
    """Per-row stopping: a row is done once it emitted a newline-bearing token (EOS is handled by generate)."""

    def __init__(self, stop_ids: frozenset[int], prompt_len: int):
        self.stop = torch.tensor(sorted(stop_ids), dtype=torch.long)
        self.prompt_len = prompt_len

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        if input_ids.shape[1] <= self.prompt_len:
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)
        return torch.isin(input_ids[:, -1], self.stop)


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids, mask


class HFGenerator:
    """Generation through ``transformers``' ``generate`` on the training model itself (no weight sync)."""

    def __init__(self, model, tokenizer, *, dtype: str = "bfloat16", max_batch: int = 32,
                 stop_at_newline: bool = True):
        self.model = model
        self.tok = tokenizer
        self.dtype = dtype
        self.max_batch = max_batch
        self.stop_ids = _newline_ids(tokenizer) if stop_at_newline else frozenset()
        self.calls = 0  # batched calls made (tests assert one per turn)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], *, max_new_tokens: int = 12, temperature: float = 1.0,
                 top_p: float = 1.0, top_k: int = 0) -> list[Generation]:
        self.calls += 1
        out: list[Generation | None] = [None] * len(prompts)
        # Sort by length so each chunk pads little; order is restored on return.
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        for start in range(0, len(order), self.max_batch):
            chunk = order[start:start + self.max_batch]
            gens = self._generate_chunk([prompts[i] for i in chunk], max_new_tokens, temperature, top_p, top_k)
            for i, g in zip(chunk, gens):
                out[i] = g
        return out  # type: ignore[return-value]

    def _generate_chunk(self, prompts, max_new_tokens, temperature, top_p, top_k) -> list[Generation]:
        from transformers import StoppingCriteriaList

        pad = self.tok.pad_token_id
        eos = self.tok.eos_token_id
        ids, mask = left_pad(prompts, pad)
        sample = temperature > 0
        kwargs = dict(do_sample=sample, max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=eos,
                      return_dict_in_generate=True, output_logits=True)
        if sample:
            kwargs.update(temperature=temperature, top_p=top_p, top_k=top_k)
        stops = StoppingCriteriaList([_StopAtLineEnd(self.stop_ids, ids.shape[1])]) if self.stop_ids else None
        was_training = self.model.training
        self.model.eval()
        try:
            with autocast(self.dtype):
                res = self.model.generate(input_ids=ids, attention_mask=mask, stopping_criteria=stops, **kwargs)
        finally:
            self.model.train(was_training)
        new = res.sequences[:, ids.shape[1]:]
        t = temperature if sample else 1.0
        logits = torch.stack(res.logits, dim=1).float() / t  # (B, L, V)
        logp = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        gens = []
        for row in range(new.shape[0]):
            toks, lps = [], []
            for j, tid in enumerate(new[row].tolist()):
                toks.append(tid)
                lps.append(float(logp[row, j]))
                if tid == eos or tid in self.stop_ids:
                    break
            text = self.tok.decode(toks, skip_special_tokens=True)
            gens.append(Generation(toks, lps, text))
        return gens
