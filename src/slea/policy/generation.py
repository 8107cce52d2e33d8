"""Batched generation with the log-probabilities the policy ratio needs.

One call generates for every live env of a turn. On a 2-core CPU generation cost follows prompt tokens
(prefill), so the engine prefills each distinct token run once:

1. duplicate prompts are prefilled once (G copies of a task have identical prompts, always at the first turn);
2. the distinct prompts form a trie of shared prefixes (slea/policy/prefix.py, as the training forward), cut by
   default to its first level: the system message and example exchange that every prompt shares, run once (with
   ``prefix_levels=None`` also a game's goal and any earlier turn that several copies share, level by level);
3. each row's own tokens run after its deepest shared prefix's KV, and the KV cache is then fanned out to one
   row per prompt and rows are sampled independently.

A row stops at EOS, unless the call allows multi-line answers at the first token containing a newline (an
answer is one command on one line), and at the token that completes one of the call's ``stop`` strings (a tool
env taking one call per turn stops at ``</tool_call>``); the tokens are kept as generated, the stop included. The returned log-probs are ``log_softmax(logits / T)`` of the sampled
tokens — the quantity the training forward computes — so the PPO ratio starts near 1 (the remaining gap is bf16
numerics; it is reported).

Reproducible sampling: with ``rng_keys`` each row draws its tokens from its own random stream,
``numpy.random.default_rng(key)``, one uniform per new token, turned into a token by the inverse CDF of the
row's (tempered, top-k/top-p truncated) distribution. What a row samples then depends only on its key and its
logits: not on the process's global RNG, on what ran before, or on the other rows of the batch. The collector
keys rows by (purpose, env seed, copy, turn), so two evaluations of the same weights are paired episode by
episode.

Bounded work: a row never decodes past the model's context (``max_position_embeddings``), however large
``max_new_tokens`` is, so neither the decode loop nor a row's uniforms grow with an absurd request; and a
``cancel`` callable, checked before the prefill and between decode steps, stops a generation whose caller has gone
(:class:`GenerationCancelled`: ``slea serve`` when its client disconnects or its time limit passes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch

from slea.algorithms.entropy import entropy_from_logprobs
from slea.device import model_device


class GenerationCancelled(RuntimeError):
    """A generation stopped because its ``cancel`` callable said so (nothing is returned)."""


def context_length(model) -> int | None:
    """The longest sequence ``model`` was built for (``max_position_embeddings``, or ``n_positions`` /
    ``max_seq_len``), or None when its config names none (a peft wrapper answers for its base)."""
    config = getattr(model, "config", None)
    for key in ("max_position_embeddings", "n_positions", "max_seq_len"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def decode_steps(max_new_tokens: int, prompt_len: int, context: int | None) -> int:
    """How many tokens a row of a ``prompt_len``-token prompt decodes: ``max_new_tokens``, capped so that prompt and
    answer fit the ``context`` (at least one token: a prompt that already fills it still gets its answer's first)."""
    if context is None:
        return max_new_tokens
    return max(1, min(max_new_tokens, context - prompt_len))


@dataclass
class Generation:
    ids: list[int]
    logprobs: list[float]
    text: str
    # per generated token, the entropy of the distribution it was drawn from (tempered, untruncated; the
    # in-process engine reports it, engines that do not leave it empty)
    entropy: list[float] = field(default_factory=list)


def autocast(dtype: str, device: str | torch.device = "cpu"):
    """bf16 autocast on ``device``'s type (``dtype == "bfloat16"``), else nothing: fp32 compute."""
    if dtype == "bfloat16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@lru_cache(maxsize=8)
def _newline_ids(tokenizer) -> frozenset[int]:
    vocab = tokenizer.get_vocab()
    ids = set()
    for tid in vocab.values():
        if "\n" in tokenizer.decode([tid]):
            ids.add(tid)
    return frozenset(ids)


def left_pad(seqs: list[list[int]], pad_id: int, device: str | torch.device | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)`` of the rows left-padded to the longest, built on the host and moved to ``device`` in one
    copy each."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long, device="cpu")  # host: filled, then moved
    mask = torch.zeros((len(seqs), width), dtype=torch.long, device="cpu")  # host: filled, then moved
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long, device="cpu")  # host: a row of ids
            mask[i, width - len(s):] = 1
    if device is not None and torch.device(device).type != "cpu":
        ids, mask = ids.to(device), mask.to(device)
    return ids, mask


class HFGenerator:
    """Sampling engine over any HF causal LM (the training model itself: no weight sync), with the prefill of
    shared prefixes and duplicate prompts reused. ``max_batch`` bounds the rows decoded together
    (``rollout.max_batch``); ``prefix_levels`` the levels of the prefill's trie (default 1: the prompts' common prefix
    alone, slea/policy/prefix.py's ``DEFAULT_LEVELS``, which says why; None: every level; 0: none). Every tensor is
    made on the model's device; each decode step copies its sampled tokens and log-probs to the host once."""

    def __init__(self, model, tokenizer, *, dtype: str = "bfloat16", max_batch: int = 32,
                 stop_at_newline: bool = True, prefix_levels: int | None = 1):
        self.model = model
        self.prefix_levels = prefix_levels
        self.tok = tokenizer
        self.dtype = dtype
        self.max_batch = max_batch
        self.stop_ids = _newline_ids(tokenizer) if stop_at_newline else frozenset()
        self.calls = 0  # batched calls made (tests assert one per turn)

    def sync_weights(self, model) -> None:
        """Nothing to do: this engine generates with the training model itself (slea/policy/engines.py)."""

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], *, max_new_tokens: int = 12, temperature: float = 1.0,
                 top_p: float = 1.0, top_k: int = 0, rng_keys: Sequence[Sequence[int]] | None = None,
                 stop_at_newline: bool | None = None, stop: Sequence[str] = (),
                 cancel: Callable[[], bool] | None = None,
                 on_token: Callable[[list[int], list[int], list[float]], None] | None = None) -> list[Generation]:
        """One answer per prompt. ``rng_keys``: one key (a sequence of non-negative ints) per prompt, the seed
        of that row's own random stream (module docstring); without keys rows sample from torch's global RNG.
        ``stop_at_newline``: this call's choice (``None``: the generator's default). ``stop``: strings that end a
        row at the token completing one (kept, as every token generated). ``cancel``: called before
        each chunk's prefill and between decode steps; when it returns true the call raises
        :class:`GenerationCancelled`. ``on_token(rows, tokens, logprobs)``: called after each decode step with the
        prompts (their indices) that drew a token and what they drew (a server streams them). No row decodes past
        the model's context (:func:`decode_steps`)."""
        self.calls += 1
        if rng_keys is not None and len(rng_keys) != len(prompts):
            raise ValueError(f"{len(rng_keys)} rng_keys for {len(prompts)} prompts")
        if stop_at_newline is None:
            stops = self.stop_ids
        else:
            stops = _newline_ids(self.tok) if stop_at_newline else frozenset()
        out: list[Generation | None] = [None] * len(prompts)
        device = model_device(self.model)
        context = context_length(self.model)
        for start in range(0, len(prompts), self.max_batch):
            idx = list(range(start, min(start + self.max_batch, len(prompts))))
            # the chunk's decode length, capped by the context: a row's uniforms are a prefix of its stream, so
            # the cap changes no draw (only how many are made)
            steps = decode_steps(max_new_tokens, max(len(prompts[i]) for i in idx), context)
            if cancel is not None and cancel():
                raise GenerationCancelled("generation cancelled")
            uniforms = None
            if rng_keys is not None and temperature > 0:
                uniforms = torch.from_numpy(np.stack([row_uniforms(rng_keys[i], steps) for i in idx]
                                                     )).to(device)
            drew = None if on_token is None else (
                lambda rows, t, lp, idx=idx: on_token([idx[r] for r in rows], t, lp))
            gens = self._generate_chunk([prompts[i] for i in idx], steps, temperature, top_p, top_k,
                                        uniforms, stops, cancel, tuple(s for s in stop if s), drew)
            for i, g in zip(idx, gens):
                out[i] = g
        return out  # type: ignore[return-value]

    def _forward(self, ids, mask, pos, cache):
        with autocast(self.dtype, ids.device):
            res = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache,
                             use_cache=True, logits_to_keep=1)
        return res.logits[:, -1].float(), res.cache

    def _generate_chunk(self, prompts, max_new_tokens, temperature, top_p, top_k, uniforms, stops, cancel=None,
                        stop_strings: tuple[str, ...] = (), on_token=None) -> list[Generation]:
        from slea.policy.prefix import build_trie, trie_prefill  # prefix.py builds on this module's helpers

        was_training = self.model.training
        self.model.eval()
        dev = model_device(self.model)
        try:
            # Distinct prompts, each prefilled once, over a trie of their shared prefixes.
            uniq: dict[tuple[int, ...], int] = {}
            row_to_u = [uniq.setdefault(tuple(p), len(uniq)) for p in prompts]
            distinct = [list(k) for k in uniq]
            with autocast(self.dtype, dev):
                logits, cache, mask, last_pos = trie_prefill(self.model, build_trie(distinct, self.prefix_levels),
                                                               distinct)
            # Fan out to one row per prompt.
            sel = torch.tensor(row_to_u, dtype=torch.long, device=dev)
            cache.batch_select_indices(sel)
            logits, mask, last_pos = logits[sel].float(), mask[sel], last_pos[sel]
            return self._decode(logits, cache, mask, last_pos, max_new_tokens, temperature, top_p, top_k,
                                uniforms, stops, cancel, stop_strings, on_token)
        finally:
            self.model.train(was_training)

    def _decode(self, logits, cache, mask, last_pos, max_new_tokens, temperature, top_p, top_k, uniforms,
                stop_ids, cancel=None, stop_strings: tuple[str, ...] = (), on_token=None):
        n = logits.shape[0]
        dev = logits.device
        stops = set(stop_ids) | {self.tok.eos_token_id}
        toks: list[list[int]] = [[] for _ in range(n)]
        lps: list[list[float]] = [[] for _ in range(n)]
        ents: list[list[float]] = [[] for _ in range(n)]
        live = list(range(n))  # rows still generating (host list); the cache holds only these
        live_t = torch.arange(n, device=dev)
        # a stop string ends within the newest token and every token decodes to at least one character, so the
        # last len(stop) + 1 tokens hold any stop the newest token completes
        window = max((len(s) for s in stop_strings), default=0) + 1
        for step in range(max_new_tokens):
            u = uniforms[live_t, step] if uniforms is not None else None
            nxt, logp, ent = sample_next(logits, temperature, top_p, top_k, uniforms=u)
            host_tok, host_lp, host_ent = to_host(nxt, logp, ent)
            for row, t, lp, h in zip(live, host_tok, host_lp, host_ent):
                toks[row].append(int(t))
                lps[row].append(lp)
                ents[row].append(h)
            if on_token is not None:
                on_token(list(live), [int(t) for t in host_tok], list(host_lp))
            keep = [j for j, t in enumerate(host_tok) if int(t) not in stops
                    and not (stop_strings and self._stopped(toks[live[j]], stop_strings, window))]
            if step == max_new_tokens - 1 or not keep:
                break
            if cancel is not None and cancel():
                raise GenerationCancelled(f"generation cancelled after {step + 1} tokens")
            if len(keep) < len(live):
                live = [live[j] for j in keep]
                keep_t = torch.tensor(keep, dtype=torch.long, device=dev)
                live_t, nxt, mask, last_pos = live_t[keep_t], nxt[keep_t], mask[keep_t], last_pos[keep_t]
                cache.batch_select_indices(keep_t)
            mask = torch.cat([mask, torch.ones(len(live), 1, dtype=torch.long, device=dev)], dim=1)
            last_pos = last_pos + 1
            logits, cache = self._forward(nxt.unsqueeze(1), mask, last_pos.unsqueeze(1), cache)
        return [Generation(t, lp, self.tok.decode(t, skip_special_tokens=True), h)
                for t, lp, h in zip(toks, lps, ents)]

    def _stopped(self, ids: list[int], stop_strings: tuple[str, ...], window: int) -> bool:
        """Whether the row's newest token completes one of ``stop_strings`` (the row's earlier tokens did not:
        it would have stopped there)."""
        tail = self.tok.decode(ids[-window:], skip_special_tokens=True)
        return any(s in tail for s in stop_strings)


def to_host(tokens: torch.Tensor, logprobs: torch.Tensor, entropy: torch.Tensor
            ) -> tuple[list[float], list[float], list[float]]:
    """A decode step's sampled tokens, their log-probs and the entropies as host lists, in one device-to-host copy
    (token ids are exact in float64; log-probs and entropies keep their float32 values)."""
    host_tok, host_lp, host_ent = torch.stack([tokens.double(), logprobs.double(), entropy.double()]).tolist()
    return host_tok, host_lp, host_ent


def forward_after_prefix(module, prefix_ids: list[int], ids: torch.Tensor, attn: torch.Tensor, **kwargs):
    """``module`` over ``prefix_ids + row`` for each left-padded row of ``ids``/``attn``, with the common prefix
    run once at batch 1 and its KV cache fanned out to the rows; gradients flow through the prefix, so output
    and gradients equal the plain forward. ``kwargs`` go to the second call (e.g. ``logits_to_keep``); when they
    hold ``logits_to_keep`` (a causal LM), the prefix call keeps one position's logits, since the caller discards
    the prefix's (its LM head over every prefix position was 8 % of a GRPO step's FLOPs, bench/mfu.py)."""
    from transformers import DynamicCache

    if torch.is_grad_enabled() and module.training and checkpointing(module):
        raise RuntimeError("the shared-prefix forward needs each layer's KV cache, which a gradient-checkpointed "
                           "layer drops in training: run the plain forward (share_prefix=False)")
    n = len(prefix_ids)
    dev = ids.device
    config = getattr(module, "config", None) or module.get_base_model().config  # a peft wrapper has none
    head = {"logits_to_keep": 1} if "logits_to_keep" in kwargs else {}
    cache = module(input_ids=torch.tensor([prefix_ids], device=dev), position_ids=torch.arange(n, device=dev)
                   .unsqueeze(0), cache=DynamicCache(config=config), use_cache=True, **head).cache
    # Fan out by repeat, not by index-select: the latter's backward (index_put_ with accumulate) adds with
    # atomics on >1 CPU thread, so gradients changed in the last bits from run to run (docs/reliability.md).
    cache.batch_repeat_interleave(ids.shape[0])
    full = torch.cat([torch.ones(ids.shape[0], n, dtype=attn.dtype, device=dev), attn], dim=1)
    pos = (n + attn.cumsum(-1) - 1).clamp(min=0)
    return module(input_ids=ids, attention_mask=full, position_ids=pos, cache=cache, use_cache=True, **kwargs)


def checkpointing(module) -> bool:
    """Whether ``module``'s layers recompute their activations in the backward pass (gradient checkpointing): in
    training with gradients they then drop the KV cache they are given."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return any(isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing for m in module.modules())


def shared_prefix(prompts: list[list[int]]) -> int:
    """Length of the longest token prefix common to all prompts, leaving every prompt ≥ 1 token of its own."""
    if not prompts:
        return 0
    first = prompts[0]
    limit = min(len(p) for p in prompts) - 1
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return max(n, 0)


def row_uniforms(key: Sequence[int], n: int) -> np.ndarray:
    """The ``n`` uniforms in [0, 1) of one row's random stream: ``numpy.random.default_rng(key)``."""
    return np.random.default_rng([int(k) for k in key]).random(n)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, the token ``k`` with ``cdf[k−1] ≤ u·total < cdf[k]`` (float64 cumulative sums): a draw from
    ``probs`` (unnormalised rows are fine) fixed by one uniform ``u`` per row; zero-probability tokens are never
    chosen."""
    cdf = probs.double().cumsum(-1)
    x = (u.double() * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, x, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)


def sample_next(logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0,
                uniforms: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample one token per row; return ``(tokens, log_softmax(logits / T)[token], entropy)``, the entropy that of
    ``softmax(logits / T)`` (:func:`slea.algorithms.entropy.entropy_from_logprobs`).

    ``temperature == 0`` is greedy (log-probs at T = 1). top-k / top-p truncate the sampling distribution
    only; the recorded log-prob is of the untruncated tempered distribution, as the training forward sees it.
    ``uniforms`` (one per row): sample by :func:`inverse_cdf` instead of ``torch.multinomial``.
    """
    if temperature <= 0:
        logp = torch.log_softmax(logits, -1)
        tok = logits.argmax(-1)
        return tok, logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1), entropy_from_logprobs(logp)
    scaled = logits / temperature
    logp = torch.log_softmax(scaled, -1)
    filt = scaled
    if top_k and top_k < filt.shape[-1]:
        kth = torch.topk(filt, top_k, dim=-1).values[:, -1:]
        filt = filt.masked_fill(filt < kth, float("-inf"))
    if top_p < 1.0:
        srt, order = torch.sort(filt, descending=True, dim=-1)
        cum = torch.softmax(srt, -1).cumsum(-1)
        drop = cum - torch.softmax(srt, -1) > top_p  # keep the smallest set whose mass reaches top_p
        srt = srt.masked_fill(drop, float("-inf"))
        filt = torch.full_like(filt, float("-inf")).scatter(-1, order, srt)
    probs = torch.softmax(filt, -1)
    tok = inverse_cdf(probs, uniforms) if uniforms is not None else torch.multinomial(probs, 1).squeeze(-1)
    return tok, logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1), entropy_from_logprobs(logp)
