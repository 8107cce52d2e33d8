"""The policy update: token log-probs at response positions only, then clipped policy-gradient steps.

Every algorithm's advantages arrive in one layout, :class:`Sample` rows with one advantage per response token
(:func:`to_samples`), which every registered policy loss consumes. The LM head runs on the response positions
alone (``logits_to_keep``): with a 49k vocabulary the output layer dominates, so this roughly doubles training
throughput on CPU.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from slea.algorithms.entropy import entropy_from_logprobs
from slea.algorithms.kl import kl_penalty
from slea.algorithms.losses import aggregate
from slea.algorithms.registry import get_policy_loss
from slea.config import AlgorithmSection, TrainSection, loss_settings
from slea.device import model_device
from slea.parallel.distributed import DataParallel, is_sharded, lockstep_passes
from slea.policy.generation import autocast, checkpointing
from slea.policy.prefix import DEFAULT_LEVELS, build_trie, refuse_checkpointing, trie_forward
from slea.types import Step


@dataclass
class Sample:
    """One training row: a step's prompt and response, and one advantage per response token."""

    prompt_ids: list[int]
    response_ids: list[int]
    old_logprobs: list[float]
    advantages: list[float]
    ref_logprobs: list[float] | None = None
    trainer_logprobs: list[float] | None = None  # π_old by the training forward (``algorithm.old_logprobs``)


def to_samples(rows: list[Step], token_advantages: list[np.ndarray], skip_zero: bool,
               keep: np.ndarray | None = None) -> list[Sample]:
    """The training rows of a batch: every step row with a response (and ``keep`` true, when given: the rows
    the algorithm trains), with its per-token advantages; with ``skip_zero`` rows whose advantages are all 0
    are left out.

    Such rows add no policy gradient, but kept they count in the aggregation's denominator: skipping them
    scales the policy gradient up by ``N_all / N_kept`` under ``token-mean`` (response tokens) and by
    ``B_all / B_kept`` under the ``seq-mean-*`` modes (rows). So with ``skip_zero`` the step size does not shrink
    when many groups have equal returns (as DAPO's dynamic sampling keeps it); the KL term, when there is one,
    is then averaged over the kept rows' tokens only."""
    keep = np.ones(len(rows), dtype=bool) if keep is None else np.asarray(keep, dtype=bool)
    return [Sample(r.prompt_ids, r.response_ids, r.old_logprobs, [float(x) for x in a])
            for r, a, k in zip(rows, token_advantages, keep)
            if k and r.response_ids and not (skip_zero and np.all(np.abs(a) < 1e-8))]


def response_logprobs(model, samples: list[Sample], *, temperature: float = 1.0, dtype: str = "bfloat16",
                      share_prefix: bool = True, prefix_levels: int | None = DEFAULT_LEVELS
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs of each sample's response, right-aligned: ``(logp, mask)`` of shape (B, K).

    Rows are left-padded prompt+response, so every response ends at the last column; column j of the
    result is the (K−j)-th token from the end, and ``mask`` marks the row's real response tokens.

    With ``share_prefix`` the token prefixes that rows share run once, nested as a trie (slea/policy/prefix.py)
    of at most ``prefix_levels`` levels (default: the micro-batch's common prefix, its system message and example
    exchange; None: also a game's goal, a GRPO group's whole prompt), and their KV cache is fanned out to the rows;
    gradients flow through the shared prefixes, so the result and its gradient equal the plain forward.
    """
    logp, mask, _ = response_logprobs_entropy(model, samples, temperature=temperature, dtype=dtype,
                                              share_prefix=share_prefix, entropy=False, prefix_levels=prefix_levels)
    return logp, mask


def response_logprobs_entropy(model, samples: list[Sample], *, temperature: float = 1.0, dtype: str = "bfloat16",
                              share_prefix: bool = True, entropy: bool = True, entropy_grad: bool = False,
                              prefix_levels: int | None = DEFAULT_LEVELS
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """:func:`response_logprobs` and, with ``entropy``, each response position's entropy of ``softmax(logits / T)``
    (slea.algorithms.entropy, from the same log-softmax: no extra forward; 0 at padding): ``(logp, mask, ent)``.
    ``entropy_grad``: the entropy carries a gradient (an entropy bonus); else it is a detached value.
    ``prefix_levels`` bounds the shared-prefix trie's depth (1, the default: the micro-batch's common prefix
    alone; None: every level)."""
    k = max(len(s.response_ids) for s in samples)
    prompts = [s.prompt_ids for s in samples]
    if share_prefix:  # refused whether or not these rows share a prefix long enough to be a node
        refuse_checkpointing(model)
    trie = build_trie(prompts, prefix_levels if share_prefix else 0)
    dev = model_device(model)
    with autocast(dtype, dev):
        logits, ids = trie_forward(model, trie, prompts, [s.response_ids for s in samples], logits_to_keep=k + 1)
    logits = logits[:, :-1].float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    targets = ids[:, -k:]
    log_soft = torch.log_softmax(logits, dim=-1)
    logp = log_soft.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    lens = torch.tensor([len(s.response_ids) for s in samples], device=dev)
    mask = (torch.arange(k, device=dev).unsqueeze(0) >= (k - lens).unsqueeze(1)).float()
    ent = None
    if entropy:
        ent = entropy_from_logprobs(log_soft if entropy_grad else log_soft.detach()) * mask
    return logp * mask, mask, ent


def right_aligned(rows: Sequence[Sequence[float] | None], k: int,
                  device: str | torch.device | None = None) -> torch.Tensor:
    """``(len(rows), k)`` float32, each row's values at its right end (zeros before; an empty or ``None`` row is
    all zeros), built on the host and moved to ``device`` in one copy."""
    out = torch.zeros(len(rows), k, device="cpu")  # host: filled row by row, then moved once
    for i, r in enumerate(rows):
        if r:
            out[i, k - len(r):] = torch.tensor(r, dtype=torch.float32, device="cpu")  # host: one row
    return out if device is None else out.to(device)


def share_prefix_for(model, sharded: bool) -> bool:
    """Whether the update's forwards share the rows' prefixes (:func:`response_logprobs`): not under FSDP (one
    forward per backward, distributed.py) and not under gradient checkpointing (a checkpointed layer drops the
    prefix's KV cache)."""
    return not sharded and not checkpointing(model)


@torch.no_grad()
def reference_logprobs(model, samples: list[Sample], *, micro_batch: int, temperature: float, dtype: str,
                       reference=None, dp: DataParallel | None = None, share_prefix: bool = True,
                       passes: int = 0, spare: Sample | None = None) -> None:
    """Fill ``ref_logprobs`` from π_ref: ``reference`` (a frozen copy of the starting weights) when given, else
    ``model`` with its LoRA adapters disabled. A model without adapters and no ``reference`` is an error: its
    "reference" would be the current policy and the KL term would be 0. With ``dp`` each rank computes its
    share of the rows and every rank receives all of them.

    ``passes``: run at least this many forwards, the ones past the rows' own on ``spare`` (kept nowhere): a
    sharded model's lockstep. They run inside the same adapter context as the others, because peft reshards
    the FSDP units when that context opens or closes, and a rank that did so once more than another would
    all-gather once more (a collective mismatch)."""
    if dp is not None and dp.world > 1:
        mine = dp.share(samples)
        sharded = is_sharded(model)
        lockstep = lockstep_passes(len(samples), dp.world, micro_batch) if sharded else 0  # distributed.py
        reference_logprobs(model, mine, micro_batch=micro_batch, temperature=temperature, dtype=dtype,
                           reference=reference, share_prefix=not sharded, passes=lockstep, spare=samples[0])
        every = [row for part in dp.gather([s.ref_logprobs for s in mine]) for row in part]
        for s, row in zip(samples, every):
            s.ref_logprobs = row
        return
    if reference is None and not hasattr(model, "disable_adapter"):
        raise ValueError("the KL reference of a fully fine-tuned policy must be a frozen copy of the starting "
                         "weights: pass reference=")
    ctx = model.disable_adapter() if reference is None else contextlib.nullcontext()
    net = model if reference is None else reference
    chunks = [samples[start:start + micro_batch] for start in range(0, len(samples), micro_batch)]
    with ctx:
        for chunk in chunks + [[]] * (passes - len(chunks)):
            batch = chunk
            if not batch:  # a lockstep pass past the rows' own
                assert spare is not None, "passes past the rows' own run on spare"
                batch = [spare]
            logp, mask = response_logprobs(net, batch, temperature=temperature, dtype=dtype,
                                           share_prefix=share_prefix)
            for s, row, m in zip(chunk, logp, mask):
                s.ref_logprobs = row[m.bool()].tolist()


def idle_pass(model, sample: Sample, *, temperature: float, dtype: str) -> None:
    """A forward and backward of ``sample`` with weight 0: it adds nothing to any gradient, and lets a rank with
    fewer rows than the busiest one join the collectives of a sharded model's passes (distributed.py)."""
    logp, _ = response_logprobs(model, [sample], temperature=temperature, dtype=dtype, share_prefix=False)
    (logp.sum() * 0.0).backward()


def minibatches(n_rows: int, updates: int, rng: random.Random) -> list[list[int]]:
    """Row indices of the ``min(updates, n_rows)`` mini-batches of one iteration: a shuffled order dealt round
    robin, so every row lands in exactly one mini-batch and sizes differ by at most one."""
    order = list(range(n_rows))
    rng.shuffle(order)
    n_mini = min(updates, n_rows)
    return [order[i::n_mini] for i in range(n_mini)]


@dataclass
class MiniBatch:
    """One optimizer step's rows as the update runs them: ``rows`` the whole mini-batch, prompt-sorted (the loss
    weights are its token or row counts), ``chunks`` this rank's micro-batches (``[]``: a zero-weight pass that
    keeps a sharded model's ranks in lockstep)."""

    rows: list[Sample]
    chunks: list[list[Sample]]


def plan_minibatches(samples: list[Sample], updates: int, micro_batch: int, rng: random.Random,
                     dp: DataParallel | None = None, sharded: bool = False) -> list[MiniBatch]:
    """The iteration's mini-batches (:func:`minibatches`) and this rank's micro-batches of each.

    Rows are prompt-sorted inside a mini-batch: rows of one game sit together, so each micro-batch shares a
    longer token prefix (system, example, goal, often the whole turn-0 prompt) and pads less. The gradient is the
    same sum over the mini-batch whatever the grouping."""
    plan = []
    for mini in minibatches(len(samples), updates, rng):
        rows = sorted((samples[i] for i in mini), key=lambda s: (s.prompt_ids, s.response_ids))
        mine = rows if dp is None else dp.share(rows)  # this rank's rows; the weights are the mini-batch's
        chunks = [mine[start:start + micro_batch] for start in range(0, len(mine), micro_batch)]
        if sharded:  # every rank runs the busiest rank's number of forward/backward passes (distributed.py)
            assert dp is not None, "a sharded model's ranks are dp's"
            chunks += [[]] * (lockstep_passes(len(rows), dp.world, micro_batch) - len(chunks))
        plan.append(MiniBatch(rows, chunks))
    return plan


def tis_weights(trainer_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance-sampling weights of the rollout/trainer mismatch, per token:
    ``min(π_trainer(y) / π_rollout(y), cap)`` (Yao et al. 2025, "Your efficient RL framework secretly brings you
    off-policy RL training", truncated IS; TRL's ``vllm_importance_sampling_cap``, verl's ``tis_imp_ratio_cap``).

    The tokens were sampled by the rollout engine but the policy gradient is taken under the trainer's numerics
    (π_old recomputed by the training forward); the weight corrects that, and the cap bounds its variance. A
    constant (no gradient)."""
    log_w = (trainer_logprobs - rollout_logprobs).detach().clamp(max=math.log(cap))
    return torch.exp(log_w)


@torch.no_grad()
def fill_old_and_reference(model, plan: list[MiniBatch], *, trainer: bool, reference_needed: bool,
                           reference=None, temperature: float, dtype: str, sharded: bool) -> None:
    """Before the first optimizer step: for every micro-batch exactly as the update will run it (same rows, same
    order, same shared prefix, same dtype), the training forward's log-probs of the current weights into
    ``trainer_logprobs`` (``trainer``: π_old of ``algorithm.old_logprobs: recompute | tis``) and π_ref's into
    ``ref_logprobs`` (``reference_needed``: the KL term; ``reference`` a frozen copy, else ``model`` with its
    LoRA adapters disabled).

    Because both are the same computation as the update's own forward, the ratio starts at exactly 1 and (while
    the weights equal the reference) the KL at exactly 0, in fp32 and in bf16. π_old runs in eval mode: it is the
    deterministic policy (no dropout)."""
    if reference_needed and reference is None and not hasattr(model, "disable_adapter"):
        raise ValueError("the KL reference of a fully fine-tuned policy must be a frozen copy of the starting "
                         "weights: pass reference=")
    share = share_prefix_for(model, sharded)  # as the update's own forward
    was_training = model.training
    model.eval()
    try:
        for mb in plan:
            for chunk in mb.chunks:
                batch = chunk or mb.rows[:1]  # an empty chunk is a lockstep forward of a sharded model
                if trainer:
                    logp, mask = response_logprobs(model, batch, temperature=temperature, dtype=dtype,
                                                   share_prefix=share)
                    for s, row, m in zip(chunk, logp, mask):
                        s.trainer_logprobs = row[m.bool()].tolist()
                if reference_needed:
                    ctx = model.disable_adapter() if reference is None else contextlib.nullcontext()
                    with ctx:
                        logp, mask = response_logprobs(model if reference is None else reference, batch,
                                                       temperature=temperature, dtype=dtype, share_prefix=share)
                    for s, row, m in zip(chunk, logp, mask):
                        s.ref_logprobs = row[m.bool()].tolist()
    finally:
        model.train(was_training)


def rollout_mismatch(samples: list[Sample]) -> dict[str, float]:
    """``|π_trainer(y) / π_rollout(y) − 1|`` over the response tokens of ``samples`` that have both log-probs: its
    sum, maximum and token count (the generation-vs-training numerics gap; with vLLM on a GPU it grows)."""
    dev_sum, dev_max, tokens = 0.0, 0.0, 0
    for s in samples:
        if s.trainer_logprobs and s.old_logprobs:
            dev = np.abs(np.exp(np.asarray(s.trainer_logprobs) - np.asarray(s.old_logprobs)) - 1.0)
            dev_sum, dev_max, tokens = dev_sum + float(dev.sum()), max(dev_max, float(dev.max())), tokens + dev.size
    return {"mismatch_dev_sum": dev_sum, "mismatch_max_dev": dev_max, "mismatch_tokens": float(tokens)}


def accumulated_step(optimizer, params: Sequence[torch.nn.Parameter], grad_clip: float,
                     passes: Iterable[tuple[torch.Tensor | None, Mapping[str, float]]], *,
                     dp: DataParallel | None = None) -> tuple[dict[str, float], float, bool]:
    """One optimizer step on gradients accumulated over micro-batches, as both trainers take it (the single-agent
    :func:`ppo_update`, the team's ``TeamTrainer._step``). ``passes`` yields, micro-batch by micro-batch, its loss
    already weighted by the micro-batch's share of the batch (so the summed gradient is one pass over the whole
    batch; ``None``: a pass that did its own backward) and its metrics: weighted shares, summed, and ``*_max_dev``
    values, whose maximum is kept. With ``dp`` the ranks' gradients and metrics are summed first. The gradient of
    ``params`` is clipped to norm ``grad_clip``; a non-finite norm or metric skips the step (numerical guard: the
    gradient is dropped, the weights kept). Returns the metrics, the gradient norm and whether the step was taken."""
    optimizer.zero_grad(set_to_none=True)
    acc: dict[str, float] = {}
    for loss, metrics in passes:
        if loss is not None:
            loss.backward()
        for key, v in metrics.items():
            acc[key] = max(acc.get(key, 0.0), v) if key.endswith("_max_dev") else acc.get(key, 0.0) + v
    if dp is not None:  # sum the ranks' gradients and metrics: every rank then takes the same step
        dp.all_reduce_grads(params)
        acc = dp.combine_metrics(acc)
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, grad_clip))
    if not math.isfinite(grad_norm) or any(not math.isfinite(v) for v in acc.values()):
        optimizer.zero_grad(set_to_none=True)
        return acc, grad_norm, False
    optimizer.step()
    return acc, grad_norm, True


def ppo_update(model, optimizer, samples: list[Sample], algo_cfg: AlgorithmSection, train_cfg: TrainSection, *,
               temperature: float, dtype: str, rng: random.Random, progress=None, dp: DataParallel | None = None,
               reference=None, reference_needed: bool | None = None) -> dict[str, float]:
    """``train_cfg.updates_per_iter`` optimizer steps over shuffled mini-batches (:func:`plan_minibatches`), with
    gradient accumulation over micro-batches weighted so the gradient equals one pass over the whole mini-batch,
    for every aggregation mode and for the KL term (β · token-mean of the mini-batch's KL).

    π_old (``algo_cfg.old_logprobs``, which ``auto`` resolves when the config loads; an unresolved ``auto`` acts
    as ``recompute``): ``recompute`` (as verl) — the training forward of the pre-update
    weights: the first mini-batch's own forward, detached, and one no-grad forward of the later mini-batches
    before the first step (:func:`fill_old_and_reference`), so the on-policy mini-batch has ratio exactly 1; ``rollout`` — the generator's
    log-probs (the ratio then starts at the generation-vs-training numerics gap); ``tis`` — the recomputed π_old,
    and each token's advantage weighted by :func:`tis_weights` (capped at ``algo_cfg.tis_cap``), which for the
    registered clipped losses (positively homogeneous in the advantage) equals weighting the token's loss. π_ref
    (when ``reference_needed``; default: ``algo_cfg.kl_coef > 0`` and a row lacks ``ref_logprobs``) is computed
    the same way. With a recomputed π_old the rollout/trainer mismatch is logged as ``mismatch_dev_mean`` and
    ``mismatch_max_dev`` (:func:`rollout_mismatch`, every token at the pre-update weights) and the no-grad pass's
    time as ``old_logprobs_s``.

    With ``dp`` (data parallelism, slea/parallel/distributed.py) every rank holds the same ``samples`` and runs
    its share of each mini-batch, weighted by the whole mini-batch; the summed gradients and the metrics are
    those of one process. A sharded model (``train.fsdp``) runs one forward per micro-batch, and a rank with
    fewer micro-batches than the busiest one adds zero-weight passes (:func:`idle_pass`)."""
    loss_fn = get_policy_loss(algo_cfg.policy_loss)
    kwargs = loss_settings(algo_cfg, loss_fn)
    sharded = dp is not None and is_sharded(model)  # FSDP units: one forward per backward, ranks in lockstep
    plan = plan_minibatches(samples, train_cfg.updates_per_iter, train_cfg.micro_batch, rng, dp, sharded)
    n_mini = len(plan)
    params = [p for p in model.parameters() if p.requires_grad]
    agg = algo_cfg.loss_agg
    mode = algo_cfg.old_logprobs
    if reference_needed is None:  # rows whose ref_logprobs a caller already filled keep them
        reference_needed = algo_cfg.kl_coef > 0 and any(s.ref_logprobs is None for s in samples)
    recompute = mode != "rollout"
    t0 = time.perf_counter()
    # π_old of the first mini-batch is its own forward's value (the weights have not moved yet): the no-grad pass
    # runs the later mini-batches only, and π_ref (when needed) every one
    fill_old_and_reference(model, plan[1:], trainer=recompute, reference_needed=False, temperature=temperature,
                           dtype=dtype, sharded=sharded)
    fill_old_and_reference(model, plan, trainer=False, reference_needed=reference_needed, reference=reference,
                           temperature=temperature, dtype=dtype, sharded=sharded)
    totals: dict[str, float] = {"old_logprobs_s": time.perf_counter() - t0}
    skipped = 0
    model.train()

    def passes(done: int, mb: MiniBatch):
        """Each micro-batch of mini-batch ``mb``: its loss weighted by its share of the mini-batch, and metrics."""
        rows = mb.rows
        mini_tokens = max(sum(len(s.response_ids) for s in rows), 1)
        # Every micro-batch is padded to the mini-batch's response length, so a divisor that depends on it
        # (seq-mean-token-sum-norm's T) is the one-large-batch value whatever the micro-batch size.
        k = max(len(s.response_ids) for s in rows)
        for chunk in mb.chunks:
            if not chunk:
                idle_pass(model, rows[0], temperature=temperature, dtype=dtype)
                yield None, {}
                continue
            logp, mask, ent = response_logprobs_entropy(model, chunk, temperature=temperature, dtype=dtype,
                                                        share_prefix=share_prefix_for(model, sharded),
                                                        entropy_grad=algo_cfg.entropy_coef > 0)
            assert ent is not None  # entropy=True (the default) computes it
            pad = (k - mask.shape[1], 0)
            logp, mask, ent = (torch.nn.functional.pad(x, pad) for x in (logp, mask, ent))
            rollout_old = right_aligned([s.old_logprobs for s in chunk], k, logp.device)
            if not recompute:
                old = rollout_old
            elif done == 0:  # on-policy: π_old is this very forward, detached (ratio exactly 1)
                old = logp.detach()
                for s, row, m in zip(chunk, old, mask):
                    s.trainer_logprobs = row[m.bool()].tolist()
            else:
                old = right_aligned([s.trainer_logprobs for s in chunk], k, logp.device)
            adv = right_aligned([s.advantages for s in chunk], k, logp.device)
            if mode == "tis":
                adv = adv * tis_weights(old, rollout_old, algo_cfg.tis_cap) * mask
            loss, met = loss_fn(logp, old, adv, mask, **kwargs)
            # the trained tokens' entropy, aggregated as the loss is: logged, and with entropy_coef > 0 a bonus
            # (verl's entropy_coeff: loss − c · agg(H))
            entropy = aggregate(ent, mask, agg)
            if algo_cfg.entropy_coef > 0:
                loss = loss - algo_cfg.entropy_coef * entropy
            met = {**met, "entropy": float(entropy.detach())}
            weight = (mask.sum().item() / mini_tokens) if agg == "token-mean" else len(chunk) / len(rows)
            total = loss * weight
            shares = {key: float(v) * weight for key, v in met.items() if not key.endswith("_max_dev")}
            shares["loss"] = float(loss.detach()) * weight
            if algo_cfg.kl_coef > 0 and chunk[0].ref_logprobs is not None:
                # β · token-mean(KL) over the mini-batch, whatever the policy loss's aggregation: this chunk's
                # share is its KL sum over the mini-batch's response tokens.
                ref = right_aligned([s.ref_logprobs or [] for s in chunk], k, logp.device)
                kl_share = (kl_penalty(logp, ref, algo_cfg.kl_estimator) * mask).sum() / mini_tokens
                total = total + algo_cfg.kl_coef * kl_share
                shares["kl"] = float(kl_share.detach())
                shares["loss"] += algo_cfg.kl_coef * shares["kl"]
            yield total, {**{key: float(v) for key, v in met.items() if key.endswith("_max_dev")}, **shares}

    for done, mb in enumerate(plan):
        if progress is not None:
            progress(done, n_mini)
        metrics_acc, grad_norm, stepped = accumulated_step(optimizer, params, train_cfg.grad_clip, passes(done, mb),
                                                           dp=dp)
        if not stepped:
            skipped += 1
            continue
        metrics_acc["grad_norm"] = grad_norm
        if "ratio_dev_onpolicy" not in totals and "ratio_dev_mean" in metrics_acc:
            # The first mini-batch is on-policy: its |ratio − 1| is 0 with a recomputed π_old, and the
            # generation-vs-training numerics gap with the rollout's.
            totals["ratio_dev_onpolicy"] = metrics_acc["ratio_dev_mean"]
            totals["ratio_onpolicy_max_dev"] = metrics_acc.get("ratio_max_dev", 0.0)
        for key, v in metrics_acc.items():
            if key.endswith("_max_dev"):
                totals[key] = max(totals.get(key, 0.0), v)
            else:
                totals[key] = totals.get(key, 0.0) + v / n_mini
    if recompute:  # the rollout/trainer gap of every token, all taken at the pre-update weights
        mine = [s for mb in plan for chunk in mb.chunks for s in chunk]
        gap = rollout_mismatch(mine) if dp is None else dp.combine_metrics(rollout_mismatch(mine))
        totals["mismatch_dev_mean"] = gap["mismatch_dev_sum"] / max(gap["mismatch_tokens"], 1.0)
        totals["mismatch_max_dev"] = gap["mismatch_max_dev"]
    totals["skipped_updates"] = float(skipped)
    totals["trained_tokens"] = float(sum(len(s.prompt_ids) + len(s.response_ids) for s in samples))
    totals["trained_samples"] = float(len(samples))
    return totals
