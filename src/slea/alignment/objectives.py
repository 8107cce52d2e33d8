"""The torch side of offline alignment: per-turn action log-probs of pairs, a registry of methods, one step.

A pair is :class:`PairTokens`: one :class:`slea.trainer.update.Sample` per action turn of the chosen (expert) and
rejected (failed) trajectory, each the turn's prompt ids and response ids (``encode_pair``; the encoding itself,
prompt + the rollout's stop convention, is ``slea.alignment.data.encode_turn``). A method is a loss over the
batch's :class:`TurnStats`, registered with what it needs::

    @register_alignment_method("my_method", reference=True, pairs=True)
    def my_method(chosen: TurnStats, rejected: TurnStats, *, beta: float = 0.1) -> tuple[Tensor, dict]:
        ...

Its keyword-only parameters are its settings, with the paper's defaults; :func:`alignment_step` hands each
method the settings it declares and rejects a setting no method declares, so a pipeline passes one set of
settings and never branches on the method's name.

The reference π_ref is the policy with its LoRA adapter disabled (``model.disable_adapter()``), or a frozen copy
passed as ``reference=`` (full fine-tuning). tlm-DRE's reference is the SFT policy: for LoRA that means the SFT
adapter merged into the base weights and a fresh adapter on top before alignment starts. Reference log-probs
are computed at every step in the policy forward's own batch layout and summed per turn as the policy's are
(:func:`step_reference_logprobs`), so the two sides are the same computation and every log-ratio starts at exactly 0
on every CPU kind.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from slea.algorithms.alignment import (
    dil_loss,
    dpo_loss,
    sft_nll,
    tlm_dre_loss,
    turn_adequacy,
    turn_dpo_loss,
    turn_weights,
)
from slea.device import model_device
from slea.plugins import Registry
from slea.trainer.update import Sample, reference_logprobs, response_logprobs

__all__ = [
    "ALIGNMENT_METHODS",
    "AlignmentMethod",
    "PairTokens",
    "TurnStats",
    "alignment_method_names",
    "alignment_step",
    "encode_pair",
    "encode_trajectory",
    "get_alignment_method",
    "register_alignment_method",
    "step_reference_logprobs",
    "turn_logprob_sums",
    "turn_reference_logprobs",
]

Encoder = Callable[[object], tuple[list[int], list[int]]]  # turn -> (prompt_ids, response_ids)


# -- data -------------------------------------------------------------------------------------------------------


@dataclass
class PairTokens:
    """One pair as token ids, one :class:`Sample` per action turn; ``rejected`` is empty for SFT."""

    chosen: list[Sample]
    rejected: list[Sample] = field(default_factory=list)


def encode_trajectory(traj, encode: Encoder) -> list[Sample]:
    """One :class:`Sample` per turn of ``traj`` (``encode(turn) -> (prompt_ids, response_ids)``)."""
    out = []
    for i, turn in enumerate(traj.turns):
        prompt, response = encode(turn)
        if not response:
            raise ValueError(f"{traj.env} task {traj.task}: turn {i} encodes to no response tokens")
        out.append(Sample(list(prompt), list(response), old_logprobs=[], advantages=[]))
    return out


def encode_pair(pair, encode: Encoder) -> PairTokens:
    """A :class:`slea.alignment.pairs.Pair` as token ids."""
    return PairTokens(encode_trajectory(pair.chosen, encode), encode_trajectory(pair.rejected, encode))


@dataclass
class TurnStats:
    """One side (chosen or rejected) of a batch of B pairs, per action turn, zero-padded to ``(B, T)``."""

    logp: torch.Tensor  # Σ_j log π_θ over the turn's action tokens (differentiable)
    ref_logp: torch.Tensor  # Σ_j log π_ref (a constant; zeros when the method needs no reference)
    tokens: torch.Tensor  # action tokens per turn; 0 on padding
    adequacy: torch.Tensor  # tlm-DRE Eq.9 p_i under π_ref (float64); 1 on padding (and without a reference)
    mask: torch.Tensor  # 1 on real turns

    @property
    def logratio(self) -> torch.Tensor:
        """Per-turn ``u_i = Σ_j log π_θ − log π_ref``; 0 on padding."""
        return (self.logp - self.ref_logp) * self.mask

    def weights(self, pivot: float, omega_low: float, omega_high: float) -> torch.Tensor:
        """tlm-DRE Eq.10 per turn; 0 on padding (a constant)."""
        w = turn_weights(self.adequacy.cpu().numpy(), pivot, omega_low, omega_high)
        return torch.as_tensor(w, dtype=self.logp.dtype, device=self.logp.device) * self.mask


def _side(sums: torch.Tensor, layout: list[list[int]], samples: Sequence[Sample],
          ref_sums: torch.Tensor | None = None) -> TurnStats:
    """Gather the flat per-turn ``sums`` into a padded side; ``layout[b]`` lists pair b's turn indices.
    ``ref_sums``: π_ref's per-turn sums as :func:`step_reference_logprobs` returns them (the same reduction as
    ``sums``); without them, each turn's ``ref_logprobs`` summed here (0 for a turn without)."""
    b, t = len(layout), max((len(row) for row in layout), default=0) or 1
    n = len(samples)
    dev = sums.device
    idx = torch.full((b, t), n, dtype=torch.long, device="cpu")  # host: filled row by row, then moved once
    for i, row in enumerate(layout):
        idx[i, :len(row)] = torch.tensor(row, dtype=torch.long, device="cpu")  # host: one row
    idx = idx.to(dev)
    mask = (idx < n).to(sums.dtype)
    padded = torch.cat([sums, sums.new_zeros(1)])
    has_ref = [s.ref_logprobs is not None for s in samples]
    if ref_sums is not None:
        ref = torch.cat([ref_sums.to(sums.dtype), sums.new_zeros(1)])
    else:
        ref = torch.tensor([float(np.sum(s.ref_logprobs)) if ok else 0.0 for s, ok in zip(samples, has_ref)] + [0.0],
                           dtype=sums.dtype, device=dev)
    tokens = torch.tensor([float(len(s.response_ids)) for s in samples] + [0.0], dtype=sums.dtype, device=dev)
    refs = [np.asarray(s.ref_logprobs) for s, ok in zip(samples, has_ref) if ok]
    p = np.ones(n + 1)
    if refs:
        p[[i for i, ok in enumerate(has_ref) if ok]] = turn_adequacy(refs)
    # adequacy stays float64: Eq.10 compares it with the pivot, and a float32 rounding could flip a turn at the edge
    return TurnStats(padded[idx], ref[idx], tokens[idx], torch.as_tensor(p, dtype=torch.float64, device=dev)[idx],
                     mask)


# -- registry ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AlignmentMethod:
    """An alignment loss and what it needs: reference log-probs, rejected trajectories, and whether it is linear
    in the per-turn log-prob sums (then micro-batches accumulate gradients without a first no-grad pass)."""

    name: str
    loss: Callable[..., tuple[torch.Tensor, dict[str, float]]]
    reference: bool
    pairs: bool
    linear: bool
    settings: dict[str, object]  # keyword-only parameter -> default
    summary: str = ""


ALIGNMENT_METHODS: Registry[AlignmentMethod] = Registry("alignment method", ("slea.alignment.objectives",))


def register_alignment_method(name: str, *, reference: bool = True, pairs: bool = True, linear: bool = False,
                              replace: bool = False):
    """Decorator: register ``fn(chosen: TurnStats, rejected: TurnStats, *, <settings>) -> (loss, metrics)``."""

    def wrap(fn) -> AlignmentMethod:
        params = inspect.signature(fn).parameters.values()
        settings = {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY}
        doc = (inspect.getdoc(fn) or "").split("\n\n")[0].replace("\n", " ")
        return AlignmentMethod(name, fn, reference, pairs, linear, settings, doc)

    return ALIGNMENT_METHODS.decorator(name, replace=replace, wrap=wrap)


def get_alignment_method(name: str) -> AlignmentMethod:
    """The method registered as ``name``; :class:`KeyError` listing the known ones."""
    return ALIGNMENT_METHODS.get(name)


def alignment_method_names() -> list[str]:
    return ALIGNMENT_METHODS.names()


def _margin_metrics(chosen_lr: torch.Tensor, rejected_lr: torch.Tensor) -> dict[str, float]:
    margin = (chosen_lr - rejected_lr).detach()
    return {"chosen_logratio": float(chosen_lr.detach().mean()), "rejected_logratio": float(rejected_lr.detach().mean()),
            "margin": float(margin.mean()), "accuracy": float((margin > 0).float().mean())}


@register_alignment_method("sft", reference=False, pairs=False, linear=True)
def sft(chosen: TurnStats, rejected: TurnStats) -> tuple[torch.Tensor, dict[str, float]]:
    """Behaviour cloning: token-mean NLL of the expert's action tokens (rejected turns are ignored)."""
    loss = sft_nll(chosen.logp * chosen.mask, chosen.tokens)
    return loss, {"nll": float(loss.detach())}


@register_alignment_method("dpo")
def dpo(chosen: TurnStats, rejected: TurnStats, *, beta: float = 0.1) -> tuple[torch.Tensor, dict[str, float]]:
    """DPO on (expert, failure) trajectories (ETO): −log σ(β (u_w − u_l)), u summed over action tokens."""
    cw, rl = chosen.logratio.sum(-1), rejected.logratio.sum(-1)
    return dpo_loss(cw, rl, beta).mean(), _margin_metrics(cw, rl)


@register_alignment_method("turn_dpo")
def turn_dpo(chosen: TurnStats, rejected: TurnStats, *, beta: float = 0.1, pivot: float = 0.9,
             omega_low: float = 0.2, omega_high: float = 1.0) -> tuple[torch.Tensor, dict[str, float]]:
    """Linearly turn-weighted DPO ("tlm-DRE w/o DRE"): DPO on Σ_i ω_i u_i with ω from Eq.9/10."""
    wc, wr = chosen.weights(pivot, omega_low, omega_high), rejected.weights(pivot, omega_low, omega_high)
    loss = turn_dpo_loss(chosen.logratio, rejected.logratio, wc, wr, beta).mean()
    met = _margin_metrics((wc * chosen.logratio).sum(-1), (wr * rejected.logratio).sum(-1))
    return loss, dict(met, low_weight_frac=_low_frac(wc, chosen.mask, wr, rejected.mask, omega_low))


@register_alignment_method("dil")
def dil(chosen: TurnStats, rejected: TurnStats, *, kernel: str = "ukl",
        alpha: float = 0.5) -> tuple[torch.Tensor, dict[str, float]]:
    """DIL / DRE without turn weights ("tlm-DRE w/o tlm"): a Bregman density-ratio loss on trajectory ratios."""
    cw, rl = chosen.logratio.sum(-1), rejected.logratio.sum(-1)
    return dil_loss(cw, rl, kernel, alpha=alpha).mean(), _margin_metrics(cw, rl)


@register_alignment_method("tlm_dre")
def tlm_dre(chosen: TurnStats, rejected: TurnStats, *, kernel: str = "ukl", alpha: float = 0.5,
            pivot: float = 0.9, omega_low: float = 0.2, omega_high: float = 1.0,
            chosen_factor: str = "mean") -> tuple[torch.Tensor, dict[str, float]]:
    """tlm-DRE (Eq.16/17): turn-weighted multiscale density-ratio loss, log-space reading (see
    :func:`slea.algorithms.alignment.tlm_dre_loss`)."""
    wc, wr = chosen.weights(pivot, omega_low, omega_high), rejected.weights(pivot, omega_low, omega_high)
    loss = tlm_dre_loss(chosen.logratio, rejected.logratio, wc, wr, chosen.ref_logp, chosen.tokens,
                        kernel=kernel, alpha=alpha, chosen_factor=chosen_factor).mean()
    met = _margin_metrics((wc * chosen.logratio).sum(-1), (wr * rejected.logratio).sum(-1))
    return loss, dict(met, low_weight_frac=_low_frac(wc, chosen.mask, wr, rejected.mask, omega_low))


def _low_frac(wc, mc, wr, mr, omega_low: float) -> float:
    """Fraction of real turns (both sides) the reference is sure of (weight ω_L)."""
    low = ((wc == omega_low) * mc).sum() + ((wr == omega_low) * mr).sum()
    return float(low / (mc.sum() + mr.sum()).clamp(min=1))


# -- forward passes ---------------------------------------------------------------------------------------------


def _chunks(samples: Sequence[Sample], micro_batch: int) -> Iterator[list[int]]:
    """Index lists of at most ``micro_batch`` turns, prompt-sorted so a chunk shares a longer token prefix."""
    order = sorted(range(len(samples)), key=lambda i: (samples[i].prompt_ids, samples[i].response_ids))
    for start in range(0, len(order), micro_batch):
        yield order[start:start + micro_batch]


def _chunk_sums(model, samples: Sequence[Sample], idx: list[int], dtype: str, share_prefix: bool,
                keep_tokens: bool = False) -> torch.Tensor:
    """The summed response log-probs of the turns ``idx``, one forward (``keep_tokens``: each turn's token
    log-probs also stored in its ``ref_logprobs``)."""
    logp, mask = response_logprobs(model, [samples[i] for i in idx], temperature=1.0, dtype=dtype,
                                   share_prefix=share_prefix)
    if keep_tokens:
        for i, row, m in zip(idx, logp, mask):
            samples[i].ref_logprobs = row[m.bool()].tolist()
    return logp.sum(-1)


def _sums_in_chunks(model, samples: Sequence[Sample], micro_batch: int, dtype: str, share_prefix: bool,
                    keep_tokens: bool = False) -> torch.Tensor:
    """``(N,)``: :func:`_chunk_sums` over :func:`_chunks`, put back in input order. π_θ's sums and π_ref's
    (:func:`step_reference_logprobs`) both come from here: the same forwards, the same reduction."""
    dev = model_device(model)
    out = torch.zeros(len(samples), device=dev)
    parts, where = [], []
    for idx in _chunks(samples, micro_batch):
        parts.append(_chunk_sums(model, samples, idx, dtype, share_prefix, keep_tokens))
        where += idx
    if parts:
        out = out.index_put((torch.tensor(where, device=dev),), torch.cat(parts))
    return out


def turn_logprob_sums(model, samples: Sequence[Sample], *, micro_batch: int = 8, dtype: str = "float32",
                      share_prefix: bool = True) -> torch.Tensor:
    """``(N,)``: each turn's summed action-token log-prob under ``model`` (differentiable unless called under
    ``torch.no_grad``), in micro-batches of ``micro_batch`` turns (temperature 1)."""
    return _sums_in_chunks(model, samples, micro_batch, dtype, share_prefix)


def turn_reference_logprobs(model, samples: Sequence[Sample], *, micro_batch: int = 8, dtype: str = "float32",
                            reference=None) -> list[np.ndarray]:
    """Token log-probs of each turn's response under π_ref (filled into ``Sample.ref_logprobs`` where missing):
    the input of tlm-DRE Eq.9 (``turn_adequacy``) and of the pivot histogram."""
    missing = [s for s in samples if s.ref_logprobs is None]
    if missing:
        reference_logprobs(model, missing, micro_batch=micro_batch, temperature=1.0, dtype=dtype, reference=reference)
    return [np.asarray(s.ref_logprobs, dtype=np.float64) for s in samples]


@torch.no_grad()
def step_reference_logprobs(model, samples: Sequence[Sample], *, micro_batch: int, dtype: str, reference=None,
                            share_prefix: bool = True) -> torch.Tensor:
    """π_ref's token log-probs of every turn into ``Sample.ref_logprobs``, and its per-turn sums (returned,
    ``(N,)``), computed as the policy's forward of the same step runs (:func:`_sums_in_chunks`: the same
    micro-batches, shared prefix, padding, dtype and the same summation of a turn's tokens), so that at
    θ = θ_ref every log-ratio is exactly 0 and DPO's loss exactly ln 2, in bf16 as in fp32, on every CPU kind.
    A cache filled in another batch layout would not be: a row's logits depend on its micro-batch (padding,
    shared prefix) by rounding, in bf16 up to about 0.1 nats per token where the CPU emulates bf16; and a turn's
    sum taken another way (float64 of the token values) differs from the policy's float32 sum by its rounding.
    ``reference``: a frozen copy (the SFT policy), else ``model`` with its LoRA adapters disabled."""
    if reference is None and not hasattr(model, "disable_adapter"):
        raise ValueError("the reference of a fully fine-tuned policy must be a frozen copy: pass reference=")
    net = model if reference is None else reference
    ctx = model.disable_adapter() if reference is None else contextlib.nullcontext()
    with ctx:
        return _sums_in_chunks(net, samples, micro_batch, dtype, share_prefix, keep_tokens=True)


# -- one step ---------------------------------------------------------------------------------------------------


def _known_settings() -> set[str]:
    return {k for name in alignment_method_names() for k in get_alignment_method(name).settings}


def alignment_step(model, optimizer, pairs_batch: Sequence[PairTokens], method: str, *, micro_batch: int = 8,
                   grad_clip: float = 1.0, dtype: str = "float32", reference=None, share_prefix: bool = True,
                   **settings) -> dict[str, float]:
    """One optimizer step of ``method`` on ``pairs_batch`` (the mean of its per-pair losses); returns metrics.

    ``settings``: the methods' keyword settings (``beta``, ``kernel``, ``alpha``, ``pivot``, ``omega_low``,
    ``omega_high``, ``chosen_factor``); each method takes those it declares, defaults are the paper's; a name no
    method declares is a ``TypeError``. The batch's turns run ``micro_batch`` at a time. When they fit in one
    micro-batch the loss is backpropagated directly; otherwise (the losses are non-linear in a pair's summed
    log-ratios) a no-grad pass gives every turn's log-prob sum, the loss's gradient ``g_i`` with respect to each
    sum is taken on those values, and each micro-batch backpropagates ``Σ g_i · logp_i``: the same gradient as
    one pass over the batch, at one extra forward per turn (none for a ``linear`` method such as SFT, whose
    ``g_i`` does not depend on the values). A non-finite loss or gradient norm skips the step (``skipped`` 1).
    """
    spec = get_alignment_method(method)
    unknown = sorted(set(settings) - _known_settings())
    if unknown:
        raise TypeError(f"alignment_step: unknown setting(s) {', '.join(unknown)}; "
                        f"known: {', '.join(sorted(_known_settings()))}")
    kwargs = {k: v for k, v in settings.items() if k in spec.settings}
    if not pairs_batch:
        raise ValueError("alignment_step: empty batch")
    if spec.pairs and any(not p.rejected for p in pairs_batch):
        raise ValueError(f"alignment method {spec.name!r} needs a rejected trajectory in every pair")
    chosen = [s for p in pairs_batch for s in p.chosen]
    rejected = [s for p in pairs_batch for s in p.rejected] if spec.pairs else []
    samples = chosen + rejected
    ref_sums = None
    if spec.reference:
        ref_sums = step_reference_logprobs(model, samples, micro_batch=micro_batch, dtype=dtype, reference=reference,
                                           share_prefix=share_prefix)
    layout_c, layout_r, start = [], [], 0
    for p in pairs_batch:
        layout_c.append(list(range(start, start + len(p.chosen))))
        start += len(p.chosen)
    for p in pairs_batch if spec.pairs else []:
        layout_r.append(list(range(start, start + len(p.rejected))))
        start += len(p.rejected)
    layout_r = layout_r or [[] for _ in pairs_batch]

    def evaluate(sums: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        return spec.loss(_side(sums, layout_c, samples, ref_sums), _side(sums, layout_r, samples, ref_sums), **kwargs)

    model.train()
    optimizer.zero_grad(set_to_none=True)
    if len(samples) <= micro_batch:
        loss, met = evaluate(turn_logprob_sums(model, samples, micro_batch=micro_batch, dtype=dtype,
                                               share_prefix=share_prefix))
        if math.isfinite(float(loss.detach())):
            loss.backward()
    else:
        loss, met = _two_pass(model, samples, evaluate, spec.linear, micro_batch, dtype, share_prefix)
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, grad_clip))
    ok = math.isfinite(grad_norm) and math.isfinite(float(loss.detach()))
    if ok:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return dict(met, loss=float(loss.detach()), grad_norm=grad_norm, skipped=float(not ok),
                pairs=float(len(pairs_batch)), turns=float(len(samples)),
                tokens=float(sum(len(s.response_ids) for s in samples)))


def _two_pass(model, samples, evaluate, linear: bool, micro_batch: int, dtype: str, share_prefix: bool):
    """Gradient of ``evaluate(sums)`` accumulated micro-batch by micro-batch (see :func:`alignment_step`)."""
    dev = model_device(model)
    if linear:
        point = torch.zeros(len(samples), device=dev)
    else:
        with torch.no_grad():
            point = turn_logprob_sums(model, samples, micro_batch=micro_batch, dtype=dtype, share_prefix=share_prefix)
    leaf = point.detach().requires_grad_(True)
    loss, met = evaluate(leaf)
    if not math.isfinite(float(loss.detach())):
        return loss, met
    (grad,) = torch.autograd.grad(loss, leaf)
    seen = torch.zeros(len(samples), device=dev)
    for idx in _chunks(samples, micro_batch):
        sums = _chunk_sums(model, samples, idx, dtype, share_prefix)
        (sums * grad[idx]).sum().backward()
        seen[idx] = sums.detach()
    if linear:  # the loss and metrics at the real values (the first evaluation was only for the gradient)
        with torch.no_grad():
            loss, met = evaluate(seen)
    return loss, met
