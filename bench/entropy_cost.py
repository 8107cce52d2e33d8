"""What logging the policy's token entropy costs during generation: slea's engine with and without the per-token
entropy, on the same rollout prompts.

``HFGenerator`` records, per generated token, the entropy of the distribution it was sampled from
(``slea.algorithms.entropy.entropy_from_logprobs`` on the log-softmax it already computes: one extra vocab-wide
exp, product and sum per decode step). The baseline, measured in the same invocation, is the same engine with that
function replaced by zeros of the same shape. The two alternate call by call (one untimed warm-up call each), on
bench/generation.py's prompt sets (the turn-0 batch of 4 tasks x 8 copies, and 32 later-turn prompts), sampled at
temperature 1.0, at most 10 new tokens; figures are the median wall time of ``--reps`` calls and the ratio
with / without. Also timed alone: the entropy op on one decode step's log-probs against that step's forward.

    PYTHONPATH=src .venv/bin/python bench/entropy_cost.py [--reps 7] [--out bench/results/entropy_cost.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generation import MAX_NEW, prompt_sets

OUT = Path(__file__).parent / "results" / "entropy_cost.json"


def cpu_kind() -> str:
    """The CPU model and whether it computes bf16 natively (what decides the dtype and the speed here)."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    native = [f for f in ("amx_bf16", "avx512_bf16") if f in flags]
    return f"{platform.processor() or platform.machine()}; native bf16: {', '.join(native) or 'no'}"


def time_generation(gen, batch: list[list[int]], reps: int) -> dict:
    """Median wall seconds of ``gen.generate`` on ``batch`` with the entropy op and with zeros in its place,
    alternating call by call after one warm-up call of each."""
    from slea.policy import generation

    real = generation.entropy_from_logprobs
    variants = {"with_entropy": real, "without_entropy": lambda logp: torch.zeros(logp.shape[:-1])}
    times: dict[str, list[float]] = {k: [] for k in variants}
    try:
        for rep in range(reps + 1):
            for name, fn in variants.items():
                generation.entropy_from_logprobs = fn
                torch.manual_seed(rep)
                t0 = time.perf_counter()
                gen.generate(batch, max_new_tokens=MAX_NEW, temperature=1.0)
                if rep:
                    times[name].append(time.perf_counter() - t0)
    finally:
        generation.entropy_from_logprobs = real
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"times_s": times, "median_s": med, "ratio_with_over_without": med["with_entropy"] / med["without_entropy"]}


def time_op_vs_forward(model, batch: list[list[int]], reps: int) -> dict:
    """One decode step of ``batch`` (the last prompt token of each row after a cached prefill, left-padded) against
    the entropy op on that step's log-probs: median seconds of each and their ratio."""
    from slea.algorithms.entropy import entropy_from_logprobs

    width = max(len(p) for p in batch)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
    with torch.no_grad():
        out = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], use_cache=True)
        fwd, op = [], []
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            step = model(input_ids=ids[:, -1:], attention_mask=mask, past_key_values=out.past_key_values,
                         use_cache=False)
            fwd.append(time.perf_counter() - t0)
            logp = torch.log_softmax(step.logits[:, -1].float(), -1)
            t0 = time.perf_counter()
            entropy_from_logprobs(logp)
            op.append(time.perf_counter() - t0)
    f, o = statistics.median(fwd[1:]), statistics.median(op[1:])
    return {"rows": len(batch), "vocab": int(logp.shape[-1]), "decode_forward_s": f, "entropy_op_s": o,
            "op_over_forward": o / f}


def measure(reps: int, threads: int) -> dict:
    from slea.config import ModelSection
    from slea.policy.generation import HFGenerator
    from slea.policy.model import load_policy
    from slea.precision import cpu_native_bf16, resolve_dtype

    torch.set_num_threads(threads)
    dtype = resolve_dtype("auto", native_bf16=cpu_native_bf16())
    model, tok = load_policy(ModelSection(name_or_path="embedded", lora=False, dtype=dtype))
    gen = HFGenerator(model, tok, dtype=dtype)
    sets = prompt_sets(tok)
    return {"cpu": cpu_kind(), "threads": threads, "dtype": dtype, "reps": reps, "max_new_tokens": MAX_NEW,
            "torch": torch.__version__,
            "generate": {name: time_generation(gen, batch, reps) for name, batch in sets.items()},
            "decode_step": {name: time_op_vs_forward(model, batch, reps) for name, batch in sets.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    data = measure(args.reps, args.threads)
    data["command"] = " ".join(["python", *sys.argv])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    for name, res in data["generate"].items():
        step = data["decode_step"][name]
        print(f"{name}: generate {res['median_s']['without_entropy']:.3f} s -> {res['median_s']['with_entropy']:.3f} s "
              f"with entropy (x{res['ratio_with_over_without']:.3f}); the op is {step['op_over_forward']:.2%} of a "
              f"decode step's forward ({step['rows']} rows, vocab {step['vocab']})")


if __name__ == "__main__":
    main()
