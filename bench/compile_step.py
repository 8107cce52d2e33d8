"""Whether ``torch.compile`` (inductor, on the CPU) speeds up slea's training step, and by how much.

The step is bench/mfu.py's: one ``ppo_update`` (bench/trl_step.py's ``slea_engine``: LoRA r16 on the top 15
layers of the embedded model, bf16 autocast over the default ``bfloat16_linears`` base, one micro-batch of 8,
grad clip, AdamW) on trl_step.py's two fixed batches (``grpo``: 8 completions of one prompt; ``multiturn``: 8
distinct prompts). Variants, each its own model instance (same seed, so the same weights) trained on both
batches:

- ``eager``: the step as slea runs it today;
- ``mlp_norm``: ``Module.compile(dynamic=True)`` of each decoder layer's MLP (gate, up, down with their peft LoRA
  layers, SiLU, the product) and of every RMSNorm module (the layers' two and the final one): the element-wise
  work and its casts, none of the attention or the KV cache;
- ``layers``: ``Module.compile(dynamic=True)`` of each whole decoder layer (attention and the cache's update
  included).

Per variant and batch: the seconds of the first calls, where the compiling happens (``first_logprobs_s``: the
numerics' two forwards, train mode and π_old's, where the forward graphs compile; ``old_logprobs_s``: the engine's
π_old; ``warmup_s``: the first ``--warmup`` steps, where the backward's compile), apart from the steady step, timed
as mfu.py times it: ``--steps`` rounds in which every (variant, batch) step runs once in turn (mfu.py's
``timed_rounds``: a drift of the machine's speed hits every variant alike), the median, retaken while the
process got less than 0.9 CPU seconds per wall second per thread. ``speedup`` = eager's median / the variant's.

Numerics, before any step (identical weights): the max |Δ log-prob| of the variant's response log-probs against
eager's, both of the training forward (train mode, gradients on) and of the no-grad π_old forward, against
slea.testing.numerics' ``logprob_tolerance`` (case 2: another kernel and reduction order; bf16 stages, the
largest |logit| of eager's forward as scale), beside the same difference between eager's plain left-padded
forward and its trie forward (a layout slea accepts: the noise floor); and whether the variant's π_old equals its
own training forward bit for bit (eager's does, so the first step's ratio is exactly 1: two compiled graphs need
not round alike).

Compilation: from dynamo's counters, per variant, the graphs compiled and the graph breaks (with their reasons)
in the warm-up of the first batch, of the second (new shapes: with ``dynamic=True`` few or none), and in the timed
rounds (none expected); all of dynamo's and inductor's counters at the end. Everything compiles into an empty
inductor cache (a temporary ``TORCHINDUCTOR_CACHE_DIR``), so the first calls' seconds are a first run's. A variant
that raises is recorded with its error and left out of the timing.

    PYTHONPATH=src .venv/bin/python bench/compile_step.py [--model embedded] [--steps 5] [--variants ...]

writes bench/results/compile_step.json (``--model tiny``: a temp file; ``--out``) and prints a table. Run it
alone on the machine: it is a timing.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from slea.testing.bench import write_result

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mfu  # bench/mfu.py: timed_rounds, policy_with, cpu_kind
import trl_step  # bench/trl_step.py: the fixed batches and slea's update step

OUT = Path(__file__).parent / "results" / "compile_step.json"
VARIANTS = ("eager", "mlp_norm", "layers")
# Graphs one code object may hold (dynamo's default 8, past which a frame silently runs eager): every layer runs
# one forward, so its graphs multiply (LoRA or not, the first adapted layer, train/eval, prefix/rows call).
RECOMPILE_LIMIT = 64


def compile_targets(model, variant: str) -> list[torch.nn.Module]:
    """The submodules ``variant`` compiles: none (``eager``); each decoder layer's ``mlp`` and every RMSNorm
    (``mlp_norm``); each decoder layer (``layers``). Found by class name, so a peft wrapper's modules are found."""
    if variant == "eager":
        return []
    layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    if variant == "layers":
        return layers
    if variant == "mlp_norm":
        return [layer.mlp for layer in layers] + [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    raise ValueError(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")


def compiled_policy(name: str, lora_layers: int, variant: str):
    """The default-storage policy (bench/mfu.py's ``policy_with``: same seed, same weights for every variant) with
    ``variant``'s submodules compiled in place (inductor, ``dynamic=True``); returns (model, modules compiled)."""
    model, _ = mfu.policy_with(name, lora_layers, "bf16_linears")
    targets = compile_targets(model, variant)
    for m in targets:
        m.compile(dynamic=True)
    return model, len(targets)


def dynamo_counts() -> dict:
    """Dynamo's running totals: graphs compiled (``unique_graphs``), frames compiled (a recompile of a frame
    counts again), and the graph breaks by reason."""
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"]["unique_graphs"]), "frames": int(counters["frames"]["total"]),
            "graph_breaks": dict(counters["graph_break"])}


def counts_since(before: dict) -> dict:
    now = dynamo_counts()
    breaks = {k: v - before["graph_breaks"].get(k, 0) for k, v in now["graph_breaks"].items()}
    return {"graphs": now["graphs"] - before["graphs"], "frames": now["frames"] - before["frames"],
            "graph_breaks": {k: v for k, v in breaks.items() if v}}


def logprobs(model, rows, train: bool, share_prefix: bool = True) -> torch.Tensor:
    """The rows' response log-probs (``response_logprobs``, bf16) with ``model`` in train mode and gradients on
    (the update's forward; detached) or in eval mode without (π_old's); ``share_prefix=False``: the plain
    left-padded forward instead of the trie of shared prefixes."""
    from slea.trainer.update import Sample, response_logprobs

    samples = [Sample(p, c, [0.0] * len(c), [0.0] * len(c)) for p, c in rows]
    model.train(train)
    with torch.set_grad_enabled(train):
        logp, mask = response_logprobs(model, samples, dtype="bfloat16", share_prefix=share_prefix)
    return logp.detach()[mask.bool()]


def max_abs_logit(model, rows) -> float:
    """The largest |logit| the LM head produces on the rows (eval, no grad): the scale of the log-prob bound."""
    seen: list[float] = []
    hook = model.get_output_embeddings().register_forward_hook(
        lambda _m, _i, out: seen.append(float(out.detach().abs().max())))
    try:
        logprobs(model, rows, train=False)
    finally:
        hook.remove()
    return max(seen)


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def prepare(name: str, lora_layers: int, variant: str, batches: dict, warmup: int, reference: dict | None) -> tuple:
    """One variant's model on every batch: its numerics before training (against ``reference``: eager's
    log-probs), its engines' π_old and ``warmup`` steps, timed, with the dynamo counts of each batch's first calls.
    Returns (record, {batch: step})."""
    model, compiled = compiled_policy(name, lora_layers, variant)
    rec: dict = {"compiled_modules": compiled, "batches": {}}
    steps = {}
    for shape, rows in batches.items():
        before = dynamo_counts()
        t0 = time.perf_counter()
        logp = {mode: logprobs(model, rows, train=mode == "train") for mode in ("train", "old")}
        b: dict = {"first_logprobs_s": time.perf_counter() - t0,
                   "old_equals_train": bool(torch.equal(logp["old"], logp["train"]))}
        if reference is not None:
            b["max_abs_dlogprob"] = {mode: float((logp[mode] - reference[shape][mode]).abs().max()) for mode in logp}
        _, _, step, fill_old = trl_step.slea_engine(name, rows, lora_layers, "bfloat16", model=model)
        b["old_logprobs_s"] = timed(fill_old)
        b["warmup_s"] = [timed(step) for _ in range(warmup)]
        b["compile"] = counts_since(before)
        rec["batches"][shape] = b
        rec.setdefault("logprobs", {})[shape] = logp
        steps[shape] = step
    return rec, steps


class Warnings(logging.Handler):
    """The warnings dynamo logs (a recompile limit hit names the guard that failed last), kept as text."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(short_paths(record.getMessage()))


def short_paths(text: str) -> str:
    """``text`` with each file path cut to its package-relative part (no machine's folders in a result)."""
    text = re.sub(r"[^\s\"'(]*/site-packages/", "", text)
    return text.replace(str(Path(__file__).resolve().parents[1]) + os.sep, "")


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run(name: str, variants: tuple[str, ...], steps: int, warmup: int, threads: int,
        min_cpu_per_wall: float | None) -> dict:
    """Every variant prepared (eager first: the reference), then the steady steps timed in rounds; the result."""
    from transformers import AutoConfig

    from slea.policy.model import load_tokenizer, resolve
    from slea.testing.numerics import logprob_tolerance

    torch.set_num_threads(threads)
    lora_layers = trl_step.default_lora_layers(name)
    tok = load_tokenizer(name)
    batches = {shape: trl_step.batch(tok, shape) for shape in trl_step.SHAPES}
    config = AutoConfig.from_pretrained(resolve(name))
    res: dict = {"model": name, "threads": threads, "lora_layers": lora_layers, "torch": torch.__version__,
                 "commit": commit(), "cpu": mfu.cpu_kind(), "date": time.strftime("%Y-%m-%d"),
                 "loadavg_start": os.getloadavg(), "steps": steps, "warmup": warmup, "recompile_limit": RECOMPILE_LIMIT,
                 "tokens": {s: sum(len(p) + len(c) for p, c in rows) for s, rows in batches.items()},
                 "variants": {}}
    eager_model, _ = compiled_policy(name, lora_layers, "eager")
    scale = {s: max_abs_logit(eager_model, rows) for s, rows in batches.items()}
    # the noise floor of an accepted layout change: eager's plain forward against its trie forward (case 2 too)
    res["eager_plain_vs_trie_dlogprob"] = {
        s: float((logprobs(eager_model, rows, True, share_prefix=False) - logprobs(eager_model, rows, True)).abs().max())
        for s, rows in batches.items()}
    del eager_model
    res["logprob_bound"] = {s: logprob_tolerance("bfloat16", config, max_logit=m) for s, m in scale.items()}
    res["max_abs_logit"] = scale
    reference, fns = None, {}
    dynamo_log = logging.getLogger("torch._dynamo")
    for variant in ("eager",) + tuple(v for v in variants if v != "eager"):
        t0 = time.perf_counter()
        warned = Warnings()
        dynamo_log.addHandler(warned)
        try:
            rec, steps_of = prepare(name, lora_layers, variant, batches, warmup, reference)
        except Exception as err:  # a variant that does not compile or run is a result, not the end of the run
            res["variants"][variant] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:400]}",
                                        "dynamo_warnings": warned.messages,
                                        "traceback_tail": short_paths(traceback.format_exc()[-1500:])}
            if variant == "eager":
                raise
            continue
        finally:
            dynamo_log.removeHandler(warned)
        rec["dynamo_warnings"] = warned.messages
        logp = rec.pop("logprobs")
        if variant == "eager":
            reference = logp
        rec["prepare_s"] = time.perf_counter() - t0
        for shape, b in rec["batches"].items():
            if "max_abs_dlogprob" in b:
                b["within_bound"] = max(b["max_abs_dlogprob"].values()) <= res["logprob_bound"][shape]
        res["variants"][variant] = rec
        fns.update({f"{variant}/{shape}": fn for shape, fn in steps_of.items()})
    before = dynamo_counts()
    times = mfu.timed_rounds(fns, steps, min_cpu_per_wall)
    res["timed_rounds_compile"] = counts_since(before)
    for key, t in times.items():
        variant, shape = key.split("/")
        b = res["variants"][variant]["batches"][shape]
        b.update({"step_s": t["s"], "step_s_all": t["s_all"], "cpu_per_wall": t["cpu_per_wall"], "tries": t["tries"]})
        b["speedup"] = times[f"eager/{shape}"]["s"] / t["s"]
    from torch._dynamo.utils import counters

    res["dynamo_counters"] = {k: dict(v) for k, v in counters.items()}  # everything dynamo and inductor counted
    res["loadavg_end"] = os.getloadavg()
    res["table"] = table(res)
    return res


def table(res: dict) -> str:
    lines = [f"{res['cpu']}; {res['threads']} threads; torch {res['torch']}; commit {res['commit']}", "",
             ("| batch | variant | step s | speedup | CPU/wall | first calls s (forwards, warm-up steps) | graphs | "
              "graph breaks | max abs Δ log-prob (train, π_old) | bound |"),
             "|---|---|---:|---:|---:|---|---:|---:|---|---:|"]
    for shape in trl_step.SHAPES:
        for variant, rec in res["variants"].items():
            if "error" in rec:
                lines.append(f"| {shape} | {variant} | error: {rec['error'][:120]} |||||||")
                continue
            b = rec["batches"][shape]
            first = ", ".join(f"{s:.1f}" for s in [b["first_logprobs_s"] + b["old_logprobs_s"]] + b["warmup_s"])
            d = b.get("max_abs_dlogprob")
            dl = f"{d['train']:.2e}, {d['old']:.2e}" if d and variant != "eager" else "-"
            lines.append(f"| {shape} | {variant} | {b['step_s']:.3f} | {b['speedup']:.2f}x | {b['cpu_per_wall']:.2f} | "
                         f"{first} | {b['compile']['graphs']} | {sum(b['compile']['graph_breaks'].values())} | {dl} | "
                         f"{res['logprob_bound'][shape]:.2e} |")
    return "\n".join(lines)


def cold_cache(fn: Callable[[], dict]) -> dict:
    """``fn()`` with an empty inductor cache (a temporary ``TORCHINDUCTOR_CACHE_DIR``, removed after): compile
    seconds as a first run pays them, not a reload of an earlier run's kernels."""
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        try:
            return fn()
        finally:
            if old is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = old


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded", choices=["tiny", "embedded"])
    ap.add_argument("--steps", type=int, default=5, help="timed rounds (median), after the warm-up steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per batch, where compiling happens")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS[1:]), choices=VARIANTS[1:],
                    help="compiled variants beside eager")
    ap.add_argument("--out", type=Path, default=None, help=f"default {OUT} (embedded) or a temp file (tiny)")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        ap.error("--steps and --warmup must be at least 1")
    # a recompile past the limit is an error, never a silent eager fallback
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True):
        res = cold_cache(lambda: run(args.model, tuple(args.variants), args.steps, args.warmup, args.threads,
                                     0.9 * args.threads))
    out = args.out or (OUT if args.model == "embedded" else Path(tempfile.gettempdir()) / "compile_step_tiny.json")
    write_result(res, out)
    return res


if __name__ == "__main__":
    main()
