"""bf16 autocast against fp32 on this CPU: a matmul and one LoRA training step of the embedded model.

Where the CPU computes bf16 natively (AVX-512-BF16 or AMX, oneDNN) bf16 autocast is the faster setting; elsewhere
PyTorch emulates it with a reference GEMM and it is many times slower. ``model.dtype: auto`` (slea/precision.py)
picks by this. Writes the seconds of each and their ratio, with the CPU's capability as torch reports it::

    heavy .venv/bin/python bench/cpu_dtype.py --out bench/results/cpu_dtype.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from slea.policy.generation import autocast
from slea.precision import cpu_native_bf16


def timed(fn, reps: int) -> float:
    fn()  # warm-up
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def matmul_step(dtype: str):
    a = torch.randn(256, 576)
    w = torch.randn(576, 1536, requires_grad=True)

    def run():
        with autocast(dtype):
            y = a @ w
        y.float().sum().backward()
    return run


def lora_step(model, dtype: str, batch: int, length: int):
    ids = torch.randint(10, 40_000, (batch, length))

    def run():
        with autocast(dtype):
            out = model(input_ids=ids, use_cache=False, logits_to_keep=16)
        out.logits.float().logsumexp(-1).mean().backward()
    return run


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--length", type=int, default=128)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from slea.config import ModelSection
    from slea.policy.model import load_policy

    model, _ = load_policy(ModelSection(name_or_path="embedded", dtype="float32", lora_layers=15))
    res: dict = {"cpu": platform.processor() or platform.machine(),
                 "capability": torch.backends.cpu.get_cpu_capability(), "native_bf16": cpu_native_bf16(),
                 "torch": torch.__version__, "threads": args.threads, "seconds": {}}
    for name, make, reps in (("matmul 256x576x1536 fwd+bwd", matmul_step, 5),
                             (f"embedded LoRA fwd+bwd, {args.batch}x{args.length} tokens",
                              lambda d: lora_step(model, d, args.batch, args.length), 2)):
        row = {d: timed(make(d), reps) for d in ("float32", "bfloat16")}
        row["bf16_over_fp32"] = row["bfloat16"] / row["float32"]
        res["seconds"][name] = row
        print(name, {k: round(v, 4) for k, v in row.items()})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    return res


if __name__ == "__main__":
    main()
