"""Generation and training throughput of the embedded model on this machine, each against a baseline
measured in the same run.

Generation: slea's engine (shared-prefix + duplicate-prompt prefill reuse) vs ``transformers.generate`` on the
same rollout-like prompts (4 tasks x 8 copies, the default's turn-0 batch, and a mixed later-turn batch).
Training: slea's update forward/backward (LM head on response positions only, shared prefix) vs the same
model and samples with the head over every position and no prefix sharing: an *emulation* of how TRL's
GRPOTrainer computes log-probs on CPU, written here, not TRL itself (TRL is not
installed or run; measuring the real library is the scale-out issue's); and adapters on the top 15 layers only vs
on all 30. Writes bench/results/throughput.json and prints a table.

    .venv/bin/python bench/throughput.py [--model embedded] [--reps 2]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from slea.config import ModelSection
from slea.policy.generation import HFGenerator, autocast, left_pad
from slea.policy.model import load_policy
from slea.policy.prompt_builder import PromptBuilder
from slea.testing.bench import ROLLOUT_ACTIONS as ADM
from slea.testing.bench import hf_generate
from slea.testing.bench import rollout_prompts as prompts
from slea.trainer.update import Sample, response_logprobs

OUT = Path(__file__).parent / "results" / "throughput.json"


def full_logits_logprobs(model, samples: list[Sample], dtype: str) -> torch.Tensor:
    """Baseline, an emulation of TRL's CPU log-prob path (not TRL itself): head over every position, no prefix
    sharing."""
    seqs = [s.prompt_ids + s.response_ids for s in samples]
    ids, attn = left_pad(seqs, 0)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    with autocast(dtype):
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).logits.float()
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return logp[:, -max(len(s.response_ids) for s in samples):]


def timed(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = "bfloat16"
    model, tok = load_policy(ModelSection(name_or_path=args.model, lora=True))
    builder = PromptBuilder(tok, history=2)
    rng = random.Random(0)
    gen = HFGenerator(model, tok, dtype=dtype)
    results: dict[str, dict] = {}
    for name, batch in (("turn0_4x8", prompts(builder, rng, 4, 8, later=False)),
                        ("later_turn_32_distinct", prompts(builder, rng, 4, 8, later=True))):
        ptoks = sum(len(p) for p in batch)
        gen.generate(batch[:2], max_new_tokens=4)  # warm-up
        ours = timed(lambda b=batch: gen.generate(b, max_new_tokens=10), args.reps)
        base = timed(lambda b=batch: hf_generate(model, tok, b, 10, dtype), args.reps)
        results[f"generation/{name}"] = {"prompt_tokens": ptoks, "slea_s": ours, "hf_generate_s": base,
                                         "speedup": base / ours}
    # Training: 16 samples shaped like rollout rows (shared system prefix, ~300-token prompts, ~5-token answers).
    batch = prompts(builder, rng, 4, 4, later=True)
    answers = [tok(" " + rng.choice(ADM) + "\n", add_special_tokens=False).input_ids for _ in batch]
    samples = [Sample(p, a, [0.0] * len(a), [1.0] * len(a)) for p, a in zip(batch, answers)]
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    micro = 8

    def step(fwd) -> None:
        model.zero_grad(set_to_none=True)
        for i in range(0, len(samples), micro):
            fwd(samples[i:i + micro]).sum().backward()

    def ours_fwd(chunk):
        logp, mask = response_logprobs(model, chunk, dtype=dtype)
        return logp * mask

    def base_fwd(chunk):
        return full_logits_logprobs(model, chunk, dtype)

    step(ours_fwd)  # warm-up
    ours = timed(lambda: step(ours_fwd), args.reps)
    base = timed(lambda: step(base_fwd), args.reps)
    results["training/16x~300tok"] = {"tokens": tokens, "slea_s": ours, "slea_tok_s": tokens / ours,
                                      "full_logits_s": base, "full_logits_tok_s": tokens / base,
                                      "speedup": base / ours}
    # The same step with adapters on the top 15 of 30 layers only (model.lora_layers: 15, the default preset):
    # no backward through the frozen bottom half. Baseline: adapters on every layer (the line above).
    model = load_policy(ModelSection(name_or_path=args.model, lora=True, lora_layers=15))[0]
    step(ours_fwd)  # warm-up
    top = timed(lambda: step(ours_fwd), args.reps)
    results["training/16x~300tok, LoRA top 15 layers"] = {
        "tokens": tokens, "slea_s": top, "slea_tok_s": tokens / top, "all_layers_s": ours,
        "all_layers_tok_s": tokens / ours, "speedup": ours / top}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"model": args.model, "threads": args.threads, "results": results}, indent=2))
    print(f"{'measurement':36s} {'slea':>10s} {'baseline':>10s} {'speedup':>8s}")
    for key, r in results.items():
        base_s = r.get("hf_generate_s", r.get("full_logits_s", r.get("all_layers_s")))
        print(f"{key:36s} {r['slea_s']:9.2f}s {base_s:9.2f}s {r['speedup']:7.2f}x")
    t = results["training/16x~300tok"]
    print(f"training tokens/s: slea {t['slea_tok_s']:.0f}, full-logits baseline (TRL emulation) {t['full_logits_tok_s']:.0f}, "
          f"LoRA on the top 15 layers {results['training/16x~300tok, LoRA top 15 layers']['slea_tok_s']:.0f}")


if __name__ == "__main__":
    main()
