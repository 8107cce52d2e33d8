"""Why alignment's first step logged log-ratios far from 0: π_ref computed in another batch layout than π_θ, in bf16.

At θ = θ_ref every log-ratio u = Σ log π_θ − Σ log π_ref is 0 by construction, yet the committed bf16 alignment
runs logged up to 0.76 nats per trajectory at their first step. This script replays that first step's
computation on a run's pairs (its ``expert.jsonl``, ``samples.jsonl``, ``pairs.json``; git keeps those of
searchqa_answer's DPO seed 0, which ``python experiments/align_table.py restore --env searchqa_answer`` copies into
its folder) with the embedded model and a LoRA adapter moved off the identity (the run's SFT checkpoint is not
committed; any adapter shows the effect), π_ref a frozen copy of that policy, as the pipeline does:

* ``before``: π_ref as the pipeline computed it before the fix (the failed turns alone, for the pivot histogram,
  then the chosen turns in input order; ``reference_logprobs``), π_θ in the step's prompt-sorted micro-batches;
* ``after``: π_ref computed at the step in the policy forward's own micro-batches (``step_reference_logprobs``).

It reports, per dtype, the mean and max |u| per trajectory over the first batch of pairs, and DPO's loss there
(ln 2 = 0.6931 when every u is 0)::

    heavy .venv/bin/python experiments/reference_layout.py --run experiments/results/align/searchqa_answer/runs/dpo-s0 \
        --out experiments/results/reference_layout.json
"""

from __future__ import annotations

import argparse
import copy
import json
import random
from pathlib import Path

import torch

from slea.alignment.data import encode_turn, load_jsonl
from slea.alignment.objectives import (
    PairTokens,
    encode_trajectory,
    step_reference_logprobs,
    turn_logprob_sums,
    turn_reference_logprobs,
)
from slea.config import load_config
from slea.policy.model import load_policy
from slea.policy.prompt_builder import PromptBuilder
from slea.runs.folder import RunFolder
from slea.trainer.update import reference_logprobs


def first_batch(run: Path, builder: PromptBuilder, batch_size: int, seed: int) -> list[PairTokens]:
    """The pairs of the run's first alignment step (the pipeline's shuffle of the pairs with ``seed + 1``)."""
    expert, samples = load_jsonl(RunFolder(run).expert), load_jsonl(RunFolder(run).samples)
    pairs = json.loads(RunFolder(run).pairs.read_text())["pairs"]
    order = list(range(len(pairs)))
    random.Random(seed + 1).shuffle(order)

    def enc(turn):
        return encode_turn(builder, turn)

    return [PairTokens(encode_trajectory(expert[pairs[i][0]], enc), encode_trajectory(samples[pairs[i][1]], enc))
            for i in order[:batch_size]]


def logratios(model, reference, batch: list[PairTokens], micro_batch: int, dtype: str, layout: str) -> dict:
    chosen = [s for p in batch for s in p.chosen]
    rejected = [s for p in batch for s in p.rejected]
    samples = chosen + rejected
    for s in samples:
        s.ref_logprobs = None
    if layout == "before":
        turn_reference_logprobs(model, rejected, micro_batch=micro_batch, dtype=dtype, reference=reference)
        reference_logprobs(model, [s for s in samples if s.ref_logprobs is None], micro_batch=micro_batch,
                           temperature=1.0, dtype=dtype, reference=reference)
    else:
        step_reference_logprobs(model, samples, micro_batch=micro_batch, dtype=dtype, reference=reference)
    with torch.no_grad():
        sums = turn_logprob_sums(model, samples, micro_batch=micro_batch, dtype=dtype)
    ref = torch.tensor([sum(s.ref_logprobs) for s in samples])
    u = (sums - ref).tolist()
    per_traj, start = {"chosen": [], "rejected": []}, 0
    for side, key in ((p.chosen, "chosen") for p in batch):
        per_traj[key].append(sum(u[start:start + len(side)]))
        start += len(side)
    for side in (p.rejected for p in batch):
        per_traj["rejected"].append(sum(u[start:start + len(side)]))
        start += len(side)
    margin = [c - r for c, r in zip(per_traj["chosen"], per_traj["rejected"])]
    dpo = float(torch.nn.functional.softplus(-0.1 * torch.tensor(margin)).mean())
    allu = per_traj["chosen"] + per_traj["rejected"]
    return {"chosen_logratio_mean": sum(per_traj["chosen"]) / len(batch),
            "rejected_logratio_mean": sum(per_traj["rejected"]) / len(batch),
            "max_abs_logratio": max(abs(x) for x in allu), "dpo_loss": dpo}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--adapter-scale", type=float, default=0.02)
    args = ap.parse_args(argv)
    cfg = load_config(RunFolder(args.run).config, check_unused=False)  # a run made before a default changed
    torch.manual_seed(0)
    torch.set_num_threads(cfg.run.threads)
    model, tok = load_policy(cfg.model.model_copy(update={"init_from": None}))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # an adapter that is not the identity, as an SFT-trained one
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * args.adapter_scale)
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    model.train()
    builder = PromptBuilder.from_rollout(tok, cfg.rollout)
    out = {"run": str(args.run), "micro_batch": cfg.train.micro_batch, "batch_size": cfg.align.batch_size,
           "adapter_scale": args.adapter_scale, "results": {}}
    for dtype in ("float32", "bfloat16"):
        for layout in ("before", "after"):
            batch = first_batch(args.run, builder, cfg.align.batch_size, cfg.run.seed)
            res = logratios(model, reference, batch, cfg.train.micro_batch, dtype, layout)
            out["results"][f"{dtype}/{layout}"] = res
            print(dtype, layout, {k: round(v, 6) for k, v in res.items()})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
