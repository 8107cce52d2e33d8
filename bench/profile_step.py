"""Where the training step's time goes, op by op: ``torch.profiler`` tables (top ops by self CPU time) of slea's
update, of its no-grad π_old forward and of generation, on bench/mfu.py's two batches (bench/trl_step.py's
``grpo``: 8 completions of one prompt; ``multiturn``: 8 distinct prompts).

Three phases per batch, each profiled over ``--reps`` calls after one untimed warm-up call:

- ``update``: one ``ppo_update`` as bench/mfu.py times it (embedded model, LoRA r16 on the top 15 layers, bf16
  autocast, one mini-batch in one micro-batch of 8, grad clip, AdamW);
- ``old_logprobs``: the no-grad forward that fills π_old of the later mini-batches (``response_logprobs`` in eval
  mode under ``torch.no_grad``, as ``fill_old_and_reference`` runs it);
- ``generation``: ``HFGenerator.generate`` on the batch's prompts, 10 new tokens per row (EOS hidden, so every row
  decodes all 10; bench/mfu.py's ``NoEos``).

Each op's self CPU time (the time in the op itself, not in the ops it calls) is summed over the calls and put in
one of a few kinds (:func:`kind_of`): ``matmul`` (GEMMs: mm, addmm, bmm), ``attention`` (the CPU flash-attention
kernels), ``cast_copy`` (dtype casts and copies: copy_, _to_copy, clone, cat, index/repeat), ``elementwise``
(arithmetic, activations, norms, reductions), ``softmax`` (the log-softmax over the vocabulary and its gather),
``optimizer`` (AdamW's and clipping's foreach kernels), ``alloc_view`` (allocation and views, which are cheap
per call but many), ``autograd`` (the engine's own bookkeeping: the self time of its ``evaluate_function`` and
``*Backward`` nodes) and ``other``. The table is written as JSON and markdown with the CPU kind and thread count.

    PYTHONPATH=src .venv/bin/python bench/profile_step.py [--reps 3] [--out bench/results/profile_step]

writes ``BASE.json`` and ``BASE.md`` under ``--out`` (``--model tiny``: a temp folder), BASE the storage of the
frozen base weights (``model.base_dtype`` as ``auto`` resolves it under bf16 on the CPU). The committed
``float32.*`` was taken before ``bfloat16_linears`` existed; each committed JSON's ``commit`` names the code it
profiled. Run it alone on the machine: it is a timing.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trl_step  # the fixed batches and slea's update step
from mfu import NoEos, cpu_kind

OUT = Path(__file__).parent / "results" / "profile_step"
PHASES = ("update", "old_logprobs", "generation")
KINDS = ("matmul", "attention", "cast_copy", "elementwise", "softmax", "optimizer", "alloc_view", "autograd", "other")
_MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::dot", "aten::mv"}
_CAST_COPY = {"aten::copy_", "aten::_to_copy", "aten::clone", "aten::cat", "aten::index", "aten::index_select",
              "aten::repeat_interleave", "aten::repeat", "aten::contiguous", "aten::fill_", "aten::zero_",
              "aten::index_put_", "aten::_index_put_impl_", "aten::constant_pad_nd", "aten::masked_fill_",
              "aten::scatter", "aten::scatter_", "aten::stack", "aten::where"}
_SOFTMAX = {"aten::_log_softmax", "aten::_log_softmax_backward_data", "aten::gather", "aten::scatter_add_",
            "aten::_softmax", "aten::_softmax_backward_data", "aten::logsumexp"}
_ALLOC_VIEW = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::zeros", "aten::zeros_like",
               "aten::ones", "aten::ones_like", "aten::full", "aten::view", "aten::reshape", "aten::_reshape_alias",
               "aten::as_strided", "aten::transpose", "aten::t", "aten::permute", "aten::expand", "aten::slice",
               "aten::select", "aten::unsqueeze", "aten::squeeze", "aten::narrow", "aten::split", "aten::chunk",
               "aten::unbind", "aten::detach", "aten::detach_", "aten::alias", "aten::resize_", "aten::set_",
               "aten::_unsafe_view", "aten::numpy_T", "aten::lift_fresh", "aten::item", "aten::_local_scalar_dense",
               "aten::result_type", "aten::to", "aten::linear", "aten::matmul", "aten::arange", "aten::tensor",
               "aten::new_empty", "aten::new_zeros", "aten::new_ones", "aten::new_empty_strided", "aten::broadcast_to",
               "aten::unflatten", "aten::flatten", "aten::expand_as", "aten::view_as", "aten::is_nonzero"}


def kind_of(name: str) -> str:
    """The kind (module docstring) of the profiler event ``name``."""
    if name in _MATMUL or name.startswith("mkldnn::") or "linear_pointwise" in name:
        return "matmul"
    if "scaled_dot_product" in name or "flash_attention" in name:
        return "attention"
    if name in _CAST_COPY:
        return "cast_copy"
    if name in _SOFTMAX:
        return "softmax"
    if name.startswith(("aten::_foreach", "Optimizer.")) or "clip_grad" in name:
        return "optimizer"
    if name in _ALLOC_VIEW:
        return "alloc_view"
    if name.startswith("autograd::") or name.endswith(("Backward0", "Backward1")):
        return "autograd"
    if name.startswith("aten::"):
        return "elementwise"
    return "other"


def profile(fn, reps: int) -> dict:
    """``reps`` calls of ``fn`` under ``torch.profiler`` (CPU): wall seconds per call, every op's self CPU
    seconds per call (``ops``, largest first) and their sum by kind (``kinds``)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    fn()  # warm-up, untimed
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        wall = (time.perf_counter() - t0) / reps
    ops = [{"op": e.key, "kind": kind_of(e.key), "self_s": e.self_cpu_time_total / 1e6 / reps,
            "calls": e.count / reps} for e in prof.key_averages() if e.self_cpu_time_total > 0]
    ops.sort(key=lambda o: -o["self_s"])
    kinds: Counter[str] = Counter()
    for o in ops:
        kinds[o["kind"]] += o["self_s"]
    total = sum(kinds.values())
    return {"wall_s": wall, "profiled_self_s": total, "kinds": {k: kinds.get(k, 0.0) for k in KINDS},
            "kind_share": {k: kinds.get(k, 0.0) / total for k in KINDS}, "ops": ops}


def phases(name: str, shape: str, lora_layers: int, new_tokens: int):
    """name -> zero-argument callable of the three phases on batch ``shape``."""
    from slea.policy.generation import HFGenerator
    from slea.policy.model import load_tokenizer
    from slea.trainer.update import Sample, response_logprobs

    tok = load_tokenizer(name)
    rows = trl_step.batch(tok, shape)
    model, _, step, fill_old = trl_step.slea_engine(name, rows, lora_layers, "bfloat16")
    fill_old()
    samples = [Sample(p, c, [0.0] * len(c), [0.0] * len(c)) for p, c in rows]
    gen = HFGenerator(model, NoEos(tok), dtype="bfloat16", stop_at_newline=False)
    prompts = [p for p, _ in rows]

    @torch.no_grad()
    def old_logprobs():
        model.eval()
        try:
            response_logprobs(model, samples, dtype="bfloat16")
        finally:
            model.train()

    return {"update": step, "old_logprobs": old_logprobs,
            "generation": lambda: gen.generate(prompts, max_new_tokens=new_tokens, temperature=1.0)}


def markdown(res: dict, top: int) -> str:
    lines = [f"# Profile of slea's training step ({res['model']})", "",
             (f"CPU: {res['cpu']}; {res['threads']} threads; torch {res['torch']}; model.base_dtype "
              f"{res['base_dtype']}; {res['reps']} profiled calls per phase after one warm-up; self CPU time per call "
              "(bench/profile_step.py)."), ""]
    for shape, by_phase in res["shapes"].items():
        for phase, p in by_phase.items():
            lines += phase_tables(f"{shape} / {phase}: {p['wall_s']:.3f} s per call", p, top, digits=4)
    return "\n".join(lines)


def phase_tables(title: str, p: dict, top: int, digits: int) -> list[str]:
    """Markdown lines of one profiled phase (:func:`profile`'s dict): its self time by kind, then its ``top``
    ops, seconds to ``digits`` places."""
    lines = [f"## {title}", "", "| kind | self s | share |", "|---|---:|---:|"]
    lines += [f"| {k} | {p['kinds'][k]:.{digits}f} | {p['kind_share'][k]:.1%} |" for k in KINDS if p["kinds"][k]]
    lines += ["", "| op | kind | self s | share | calls |", "|---|---|---:|---:|---:|"]
    lines += [f"| `{o['op']}` | {o['kind']} | {o['self_s']:.{digits}f} | {o['self_s'] / p['profiled_self_s']:.1%} | "
              f"{o['calls']:.0f} |" for o in p["ops"][:top]]
    return [*lines, ""]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded", choices=["tiny", "embedded"])
    ap.add_argument("--reps", type=int, default=3, help="profiled calls per phase, after one warm-up")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=10)
    ap.add_argument("--top", type=int, default=25, help="ops per table in the markdown")
    ap.add_argument("--out", type=Path, default=None, help=f"default {OUT} (embedded) or a temp folder (tiny)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    lora_layers = trl_step.default_lora_layers(args.model)
    from slea.device import resolve_base_storage

    res = {"model": args.model, "cpu": cpu_kind(), "threads": args.threads, "torch": torch.__version__,
           "base_dtype": resolve_base_storage("auto", device="cpu", lora=True, dtype="bfloat16"),
           "reps": args.reps, "lora_layers": lora_layers, "new_tokens": args.new_tokens,
           "date": time.strftime("%Y-%m-%d"), "shapes": {}}
    for shape in trl_step.SHAPES:
        fns = phases(args.model, shape, lora_layers, args.new_tokens)
        res["shapes"][shape] = {phase: profile(fns[phase], args.reps) for phase in PHASES}
    out = args.out or (OUT if args.model == "embedded" else Path(tempfile.mkdtemp()) / "profile_step")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{res['base_dtype']}.json").write_text(json.dumps(res, indent=1))
    (out / f"{res['base_dtype']}.md").write_text(markdown(res, args.top))
    for shape, by_phase in res["shapes"].items():
        for phase, p in by_phase.items():
            print(f"{shape}/{phase}: {p['wall_s']:.3f} s; " + ", ".join(
                f"{k} {p['kind_share'][k]:.0%}" for k in KINDS if p["kind_share"][k] >= 0.01))
    print(f"wrote {out}")
    return res


if __name__ == "__main__":
    main()
