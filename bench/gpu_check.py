"""The one prepared GPU check: what slea does on a GPU, measured in one run of under 8 minutes on one H200, with no
network and no downloaded weights; one JSON. The same script runs on the CPU (``--device cpu``, small shapes) as
tests/bench/test_gpu_check.py, so its logic is checked where CI runs.

Steps (each timed; one that fails is recorded with its error and the next one runs; the JSON is rewritten after
every step, so a run cut short keeps what it measured):

1. ``env`` — torch, CUDA, the device's name and memory, transformers and peft versions, and whether this
   transformers takes slea's ``cache=`` keyword (a tiny forward).
2. ``gpu_tests`` — ``pytest -m gpu`` over the device-parametrised numerics tests (update parity, shared prefix
   on/off, greedy generation CPU vs device, critic, checkpoint round trip, bf16 base, gradient checkpointing):
   passed / failed / skipped (on a CPU every one is skipped).
3. ``train`` — ``slea train`` on the tiny model and Sokoban (no extras) with ``run.device`` set, fp32 and bf16:
   exit code, rows, the summary's device, and the rollout-vs-trainer gap of the first iteration
   (``update/mismatch_dev_mean``: mean |π_trainer/π_rollout − 1| at the pre-update weights; the PPO ratio itself
   starts at 1 since π_old is recomputed).
4. ``probe_1p5b`` — a Qwen2.5-1.5B-shaped model, random weights (the config below; nothing downloaded), bf16 base,
   LoRA r16 on every projection: the in-process engine on B prompts (a shared prefix plus distinct rests), new
   tokens per second; then ``ppo_update`` calls on those rows with positive advantages: trained tokens per second,
   the loss and mean log-prob per call (they must rise), the first call's mismatch, peak memory; model FLOPs per
   second against the device's measured bf16 matmul rate (MFU). FLOPs counted as 2·N per token and forward for
   N = the decoder's linear weights (+ the LM head where logits are computed), and 2·N more per token for the
   backward (LoRA: grad-input only, the frozen weights get no gradient); attention and LoRA's own FLOPs are left
   out, so MFU is a lower bound.
5. ``memory_7b`` — a Qwen2.5-7B-shaped model, random weights: peak memory and seconds of one LoRA update pass
   (forward + backward of a micro-batch of 8 × (700 + 150) tokens) with (a) fp32 base under bf16 autocast,
   (b) bf16 base, (c) bf16 base + gradient checkpointing.
6. ``fsdp_smoke`` — one spawned rank (``slea.parallel.distributed.launch``): its process group (``cpu:gloo,cuda:nccl``
   on a GPU), FSDP2 on its device mesh, the fixed update of slea/testing/ddp.py sharded vs unsharded
   (max |Δw|), where the LoRA weights and base shards live, an object gathered over the gloo group.

The device image this is written for has torch 2.11 (CUDA 13), transformers 5.17, peft and accelerate, but lacks
these (carry them as wheels, README of the device tool; versions as in this repository's venv): pydantic 2.14.4,
pydantic-core 2.50.5, annotated-types 0.8.0, typing-inspection 0.4.5, gymnasium 1.4.0, farama-notifications
0.0.6, rapidfuzz 3.14.6, cydifflib 1.2.0. slea pins torch >= 2.13: install it with ``pip install --no-deps -e .``.
Whether transformers 5.17 takes the ``cache=`` keyword is step 1's first answer; if it does not, carry
transformers 5.25.0 with huggingface-hub 2.4.0, tokenizers 0.23.3 and their own missing needs.

    python bench/gpu_check.py --out $OUT/gpu_check.json                 # on the GPU machine
    python bench/gpu_check.py --device cpu --out /tmp/gpu_check.json    # the same logic, small shapes
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from slea.runs.folder import RunFolder

ROOT = Path(__file__).resolve().parents[1]

# Qwen2.5-1.5B-Instruct's and Qwen2.5-7B-Instruct's config.json (architecture fields), written here: no download.
QWEN = {
    "1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
             "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True},
    "7b": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
           "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 32768,
           "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False},
}
# the same architecture at a size a 2-core CPU runs in seconds (--device cpu)
SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 2048, "rope_theta": 10000.0,
         "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# shapes of the probes: (rows, shared prefix, distinct rest, new tokens, update calls) and the 7B micro-batch
SHAPES = {"cuda": {"probe": (128, 250, 450, 32, 5), "mem": (8, 700, 150), "matmul": 8192},
          "cpu": {"probe": (4, 8, 12, 4, 2), "mem": (2, 12, 4), "matmul": 256}}


class IdsOnly:
    """The tokenizer side the engine needs for random models: padding id 0, no end-of-sequence id (every row
    decodes all its tokens, so a timing does not depend on what was sampled), no text."""

    pad_token_id = 0
    eos_token_id = -1

    def decode(self, ids, skip_special_tokens=True) -> str:
        return ""


# -- building blocks -------------------------------------------------------------------------------------------
def qwen(arch: dict, device, dtype: torch.dtype, lora: bool = True, rank: int = 16):
    """A Qwen2 causal LM of ``arch`` with random weights, built on ``device`` in ``dtype`` (LoRA adapters fp32)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(**arch)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.config.use_cache = True
    if lora:
        model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS,
                                                 task_type="CAUSAL_LM"))
    return model


def linear_weights(arch: dict) -> int:
    """Weights of the decoder's linears (N of the FLOP count), without the embedding and the LM head."""
    d, f, h, kv = arch["hidden_size"], arch["intermediate_size"], arch["num_attention_heads"], arch["num_key_value_heads"]
    dh = d // h
    return arch["num_hidden_layers"] * (d * h * dh * 2 + 2 * d * kv * dh + 3 * d * f)


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def peak_reset(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gib(device) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if torch.device(device).type == "cuda" else None


def matmul_rate(device, n: int, reps: int = 10) -> float:
    """The device's bf16 matmul rate in TFLOP/s: (n, n) @ (n, n) on random data, mean of ``reps`` after 3
    warm-ups."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e12


# -- steps -----------------------------------------------------------------------------------------------------
def env_step(device: str) -> dict:
    import peft
    import transformers
    from transformers import DynamicCache

    out = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available(),
           "transformers": transformers.__version__, "peft": peft.__version__, "python": sys.version.split()[0]}
    if torch.device(device).type == "cuda":
        props = torch.cuda.get_device_properties(0)
        out.update(gpu=props.name, gpu_memory_gib=props.total_memory / 2**30, capability=list(props.major_minor)
                   if hasattr(props, "major_minor") else [props.major, props.minor])
    model = qwen(SMALL, device, torch.float32, lora=False)
    ids = torch.tensor([[1, 2, 3]], device=device)
    res = model(input_ids=ids, cache=DynamicCache(config=model.config), use_cache=True)
    out["cache_kwarg"] = res.cache is not None and res.cache.get_seq_length() == 3
    return out


def gpu_tests(device: str) -> dict:
    files = ["tests/policy/test_generation.py", "tests/policy/test_model.py", "tests/trainer/test_update.py",
             "tests/trainer/test_critic.py", "tests/runs/test_checkpoint.py"]
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                               f"--junitxml={xml}", *files], check=False, cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, timeout=300)
        import xml.etree.ElementTree as ET

        suite = ET.parse(xml).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        failed = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")
                  if c.find("failure") is not None or c.find("error") is not None]
    return {"returncode": proc.returncode, **counts, "passed": counts["tests"] - counts["failures"]
            - counts["errors"] - counts["skipped"], "failed": failed, "tail": proc.stdout[-1500:]}


def train_step(device: str, iterations: int) -> dict:
    out = {}
    for dtype in ("float32", "bfloat16"):
        with tempfile.TemporaryDirectory() as tmp:
            run = Path(tmp) / "run"
            sets = [f"run.device={device}", f"run.dir={run}", "run.threads=2", "model.name_or_path=tiny",
                    f"model.dtype={dtype}", "model.lora_r=4", "model.lora_alpha=8", "env.id=slea/Sokoban-v0",
                    "env.max_steps=3", "rollout.groups=2", "rollout.group_size=4", "rollout.max_new_tokens=6",
                    "rollout.fuzzy_cutoff=0.3", "algorithm.name=grpo", f"train.iterations={iterations}",
                    "algorithm.old_logprobs=recompute",  # π_old recomputed: the ratio starts at 1, the gap logged
                    "eval.before=false", "eval.games=1", "eval.episodes_per_game=1", "eval.greedy=false"]
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "slea.cli", "train", *[a for s in sets for a in ("--set", s)]],
                                  check=False, cwd=ROOT, capture_output=True, text=True, timeout=300,
                                  env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
            res = {"returncode": proc.returncode, "seconds": time.perf_counter() - t0}
            if proc.returncode != 0:
                res["stderr"] = proc.stderr[-1500:]
            else:
                rows = [json.loads(line) for line in RunFolder(run).metrics.read_text().splitlines() if line]
                summary = json.loads(RunFolder(run).summary.read_text())
                first = rows[0]
                res.update(rows=len(rows), device=summary.get("device"), precision=summary.get("precision"),
                           mismatch_dev_mean=first.get("update/mismatch_dev_mean"),
                           mismatch_max_dev=first.get("update/mismatch_max_dev"),
                           ratio_dev_onpolicy=first.get("update/ratio_dev_onpolicy"),
                           finite=all(math.isfinite(v) for r in rows for v in r.values()
                                      if isinstance(v, float)))
            out[dtype] = res
    return out


def probe_step(device: str) -> dict:
    import random

    from slea.config import AlgorithmSection, TrainSection
    from slea.policy.generation import HFGenerator
    from slea.trainer.update import Sample, ppo_update, response_logprobs

    arch = QWEN["1.5b"] if torch.device(device).type == "cuda" else SMALL
    rows, prefix, rest, new, calls = SHAPES[torch.device(device).type]["probe"]
    peak_reset(device)
    model = qwen(arch, device, torch.bfloat16)
    vocab = arch["vocab_size"]
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(1, vocab, (prefix,), generator=g).tolist()
    prompts = [shared + torch.randint(1, vocab, (rest,), generator=g).tolist() for _ in range(rows)]
    gen = HFGenerator(model, IdsOnly(), dtype="bfloat16", max_batch=rows, stop_at_newline=False)
    gen.generate(prompts[:2], max_new_tokens=2)  # warm-up
    sync(device)
    t0 = time.perf_counter()
    outs = gen.generate(prompts, max_new_tokens=new, temperature=1.0, rng_keys=[(0, i) for i in range(rows)])
    sync(device)
    gen_s = time.perf_counter() - t0
    n_lin = linear_weights(arch)
    head = 2 * arch["hidden_size"] * vocab
    gen_flops = (prefix + rows * (rest + new)) * 2 * n_lin + rows * new * head  # the shared prefix once
    samples = [Sample(p, o.ids, o.logprobs, [1.0] * len(o.ids)) for p, o in zip(prompts, outs)]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    algo, train = AlgorithmSection(kl_coef=0.0), TrainSection(updates_per_iter=1, micro_batch=8, grad_clip=1.0)
    history, first_mismatch, train_s = [], None, 0.0
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    for i in range(calls):
        with torch.no_grad():
            model.eval()
            logp, mask = response_logprobs(model, samples[:8], dtype="bfloat16")
            mean_logp = float((logp * mask).sum() / mask.sum())
        sync(device)
        t0 = time.perf_counter()
        met = ppo_update(model, opt, samples, algo, train, temperature=1.0, dtype="bfloat16",
                         rng=random.Random(i))
        sync(device)
        train_s += time.perf_counter() - t0
        if first_mismatch is None:
            first_mismatch = met.get("mismatch_dev_mean")
        history.append({"loss": met.get("loss"), "mean_logprob_before": mean_logp,
                        "ratio_dev_onpolicy": met.get("ratio_dev_onpolicy")})
    # per call: the no-grad π_old pass of the later mini-batches (none: one mini-batch) + forward and backward
    train_flops = calls * tokens * (2 * 2 * n_lin) + calls * sum(len(s.response_ids) for s in samples) * 2 * head
    rate = matmul_rate(device, SHAPES[torch.device(device).type]["matmul"])
    logps = [h["mean_logprob_before"] for h in history]
    return {"arch": "qwen2.5-1.5b" if arch is not SMALL else "small", "rows": rows, "prompt_tokens": prefix + rest,
            "new_tokens": new, "generation_s": gen_s, "generation_new_tokens_per_s": rows * new / gen_s,
            "generation_mfu": gen_flops / gen_s / (rate * 1e12), "update_calls": calls, "trained_tokens": tokens,
            "train_s": train_s, "train_tokens_per_s": calls * tokens / train_s,
            "train_mfu": train_flops / train_s / (rate * 1e12), "bf16_matmul_tflops": rate,
            "first_call_mismatch_dev_mean": first_mismatch, "calls": history,
            "logprob_rises_every_call": all(b > a for a, b in itertools.pairwise(logps)),
            "finite": all(math.isfinite(h["loss"]) for h in history), "peak_gib": peak_gib(device)}


def memory_step(device: str) -> dict:
    from slea.policy.model import enable_gradient_checkpointing
    from slea.trainer.update import Sample, response_logprobs

    cuda = torch.device(device).type == "cuda"
    arch = QWEN["7b"] if cuda else SMALL
    batch, prompt, response = SHAPES["cuda" if cuda else "cpu"]["mem"]
    g = torch.Generator().manual_seed(2)
    rows = [Sample(torch.randint(1, arch["vocab_size"], (prompt,), generator=g).tolist(),
                   torch.randint(1, arch["vocab_size"], (response,), generator=g).tolist(), [0.0] * response,
                   [1.0] * response) for _ in range(batch)]
    out = {"arch": "qwen2.5-7b" if cuda else "small", "micro_batch": batch, "tokens_per_row": prompt + response}
    for name, dtype, ckpt in (("fp32_base", torch.float32, False), ("bf16_base", torch.bfloat16, False),
                              ("bf16_base_checkpointing", torch.bfloat16, True)):
        peak_reset(device)
        model = qwen(arch, device, dtype)
        if ckpt:
            enable_gradient_checkpointing(model)
        model.train()
        weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
        sync(device)
        t0 = time.perf_counter()
        logp, mask = response_logprobs(model, rows, dtype="bfloat16", share_prefix=not ckpt)
        (logp * mask).sum().backward()
        sync(device)
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        out[name] = {"seconds": time.perf_counter() - t0, "weights_gib": weights, "peak_gib": peak_gib(device),
                     "grads_finite": all(gr is not None and bool(torch.isfinite(gr).all()) for gr in grads)}
        del model, logp, mask, grads
        peak_reset(device)
    return out


def fsdp_step(device: str) -> dict:
    from safetensors.torch import save_model

    from slea.parallel.distributed import launch
    from slea.policy.model import load_policy
    from slea.testing.ddp import MODEL, smoke_rank_main

    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        model, _ = load_policy(MODEL)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.05)
        state = Path(tmp) / "start.safetensors"
        save_model(model, str(state))
        launch(smoke_rank_main, 1, state, Path(tmp), device, device=device)
        return json.loads((Path(tmp) / "smoke-rank0.json").read_text())


STEPS = ("env", "gpu_tests", "train", "probe_1p5b", "memory_7b", "fsdp_smoke")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--iterations", type=int, default=3, help="slea train iterations per precision")
    ap.add_argument("--skip", default="", help=f"comma-separated steps to leave out ({', '.join(STEPS)})")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: --device cuda, but torch sees no CUDA device (use --device cpu)")
    device = "cuda:0" if args.device == "cuda" else "cpu"
    skip = {s for s in args.skip.split(",") if s}
    res: dict = {"device": device, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "steps": {}}
    work = {"env": lambda: env_step(device), "gpu_tests": lambda: gpu_tests(device),
            "train": lambda: train_step(args.device, args.iterations), "probe_1p5b": lambda: probe_step(device),
            "memory_7b": lambda: memory_step(device), "fsdp_smoke": lambda: fsdp_step(args.device)}
    t_all = time.perf_counter()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name in STEPS:
        if name in skip:
            continue
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(sys.stderr):
                result = work[name]()
            res["steps"][name] = {"ok": True, "seconds": time.perf_counter() - t0, **result}
        except Exception as exc:  # noqa: BLE001  (a failed step is a result: recorded, and the next one runs)
            res["steps"][name] = {"ok": False, "seconds": time.perf_counter() - t0,
                                  "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-3000:]}
        res["total_s"] = time.perf_counter() - t_all
        args.out.write_text(json.dumps(res, indent=1, default=str))
        print(f"{name}: {'ok' if res['steps'][name]['ok'] else 'FAILED'} in {res['steps'][name]['seconds']:.1f}s",
              flush=True)
    return res


if __name__ == "__main__":
    main()
