"""Model-FLOPs utilisation (MFU) of slea's training step against this machine's measured matmul throughput.

1. Matmul throughput: ``torch.matmul`` of (M, K) @ (K, N) in bf16 and fp32 on the model's shapes (SmolLM2-135M:
   hidden d = 576, intermediate f = 1536, k/v width 192, LoRA rank 16, LM head 576 x 49152; M = 256 and 2048
   rows), ``--threads`` threads (2, as slea runs); FLOP/s = 2·M·K·N / time, the best of 5 windows per shape
   (:func:`measure_matmul`). The *peak* of a dtype is its best shape: MFU's denominator.
2. The training step: ``ppo_update`` as the trainer calls it (bench/trl_step.py's ``slea_engine``: embedded model,
   LoRA r16 on the top 15 layers, bf16 autocast, one mini-batch in one micro-batch of 8, grad clip, AdamW) on
   trl_step.py's two fixed batches (``grpo``: 8 completions of one prompt; ``multiturn``: 8 distinct prompts);
   median of ``--steps`` after a warm-up step, with the process's CPU seconds per wall second over them
   (``cpu_per_wall``: about the thread count when the step had the cores to itself; below 0.9 x threads the
   steps are timed again, twice at most, and the try with the most CPU kept) and the load average.
3. FLOPs, counted analytically (matmul FLOPs only: 2·m·k·n per (m,k)@(k,n); norms, activations, rotary, softmax,
   the log-softmax over the vocabulary, clipping and AdamW are element-wise and not counted; embedding lookups
   are free). Per layer the linears are q (d→hq·dh), k, v (d→hkv·dh), o (hq·dh→d), gate, up (d→f), down (f→d):
   P = Σ in·out frozen weights (3.54 M for SmolLM2); an adapted module adds r·(in+out) LoRA weights.

   **Model FLOPs** (MFU's numerator), over the batch's real tokens: per micro-batch the shared prompt prefix once
   plus each row's own tokens (no padding); a "pair" is a (query, key) a causal token attends to (itself and
   every earlier token of its row, prefix included):

   - forward: every token through all L layers, 2·P + 2·r·(in+out) per adapted module (2·N_active per token,
     N_active = L·P + the LoRA weights); attention 4·hq·dh per pair per layer (QKᵀ and AV); the LM head
     2·d·V only on the positions that predict a response token (one per response token: ``logits_to_keep``).
   - backward: only through the layers from the lowest adapted one up (LoRA on the top 15: the top 15 layers;
     nothing below, as nothing there needs a gradient). Per token there, each linear on the gradient's path costs
     its grad-input 2·in·out (frozen weights: no weight-gradient FLOPs) and each adapter 4·r·(in+out) (the
     weight gradients of A and B, 2·r·in + 2·r·out, and the grad-input through B and A, the same again);
     except that a module whose input needs no gradient skips its grad-input (q, k, v of the lowest adapted
     layer read the frozen layers' output: no 2·in·out there and no 2·r·in through their A); attention
     8·hq·dh per pair per such layer (dQ, dK, dV, d(scores): twice the forward); the LM head's grad-input
     2·d·V per response token (its weight is the frozen, tied embedding).
   No other pruning is credited: the top layer's backward is counted for every token, though only the positions
   that predict a response token (and the keys and values they read) need it.

   **Executed FLOPs** (what the kernels run; its ratio to peak is the hardware-FLOPs utilisation, HFU): the same
   rules on the tensors ``response_logprobs`` builds: the prefix (n tokens, batch 1) runs through all layers
   and the LM head on its last position only (``logits_to_keep=1``; before 2026-12-02 on all n, 2·n·d·V of
   forward waste, 8 % of the GRPO step), then the B rows
   left-padded to width W (B·W tokens, padding included) against n + W keys, the head on the last k + 1
   positions (k = longest response); attention as full rectangles (the CPU flash kernel's FLOP count: n·n for
   the prefix, W·(n+W) per row), its backward 5 matmuls (scores recomputed: 10·hq·dh per pair); backward over
   all B·W row positions (the head's gradient is dense, zeros outside the kept positions) and, for the prefix,
   its full backward in every adapted layer but the top one, where only its k and v (read by the rows) get a
   gradient. ``torch.utils.flop_counter.FlopCounterMode`` on one step (the CPU flash-attention kernels added
   with torch's own SDPA formulas) must equal this count.

MFU = model FLOPs / step time / peak bf16 matmul FLOP/s (the step's matmuls run in bf16 under autocast);
``mfu_fp32`` divides by the fp32 peak instead (what the same FLOPs would be worth against fp32 matmuls: it can
pass 100 %). ``matmul_bound_s``: the step's executed FLOPs at the measured speed of each kind's
shapes (linears, LoRA, head, attention approximated by a batched matmul of its shape): the time the matmuls
alone would take; the rest of the step is element-wise work, dispatch and memory traffic.

The base's storage (``model.base_dtype``, slea/device.py): the timed step uses the default, which on a CPU under
bf16 is ``bfloat16_linears`` (the frozen linears and the LM head stored in bf16, embeddings and norms fp32: the
numbers bf16 autocast computes from an fp32 base, bit for bit). Two other storages are timed in the same run on
the same batch: ``fp32_base`` (``base_dtype: float32``, CPU's default before 2026-12-07: autocast then casts each
frozen fp32 weight again at every use, since it caches the casts of trainable leaves only, so every forward call,
two per micro-batch with a shared prefix, casts the whole frozen model; ``weight_cast``: the time of one cast of
every frozen weight matrix, times the calls) and ``frozen_bf16`` (``base_dtype: bfloat16``: every base weight
bf16, the residual stream too: other numbers). Each gets its step time, its MFU against the same peak and the
default's speedup over it; likewise a 10-token generation (``HFGenerator``, 1 and 16 copies of one prompt, EOS
hidden so every row decodes 10 tokens) with each storage.

    PYTHONPATH=src .venv/bin/python bench/mfu.py [--model embedded] [--steps 4] [--out ...]

writes bench/results/mfu.json (``--model tiny``: a temp file) and prints a table. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from slea.testing.bench import rollout_prompts, write_result

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trl_step  # bench/trl_step.py: the fixed batches and slea's update step

OUT = Path(__file__).parent / "results" / "mfu.json"
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
READ_RESIDUAL = ("q_proj", "k_proj", "v_proj")  # the modules whose input is the layer's input


@dataclass(frozen=True)
class Arch:
    """The shapes that set a step's FLOPs: a Llama-style decoder and its LoRA adapters (``adapted``: per layer,
    the adapted module names)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    rank: int
    adapted: tuple[tuple[str, ...], ...]

    @classmethod
    def of(cls, model) -> Arch:
        """The architecture of a (peft-wrapped) HF Llama-style model, adapters read off its modules."""
        cfg = getattr(model, "config", None) or model.get_base_model().config
        adapted: list[set[str]] = [set() for _ in range(cfg.num_hidden_layers)]
        rank = 0
        for name, mod in model.named_modules():
            parts = name.split(".")
            if hasattr(mod, "lora_A") and parts[-1] in LINEARS and "layers" in parts and len(mod.lora_A):
                adapted[int(parts[parts.index("layers") + 1])].add(parts[-1])
                rank = next(iter(mod.lora_A.values())).out_features
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return cls(cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
                   cfg.num_key_value_heads, head_dim, cfg.vocab_size, rank,
                   tuple(tuple(sorted(a)) for a in adapted))

    def shapes(self) -> dict[str, tuple[int, int]]:
        d, f, q, kv = self.hidden, self.intermediate, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {"q_proj": (d, q), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (q, d),
                "gate_proj": (d, f), "up_proj": (d, f), "down_proj": (f, d)}

    def frozen_per_layer(self) -> int:
        return sum(i * o for i, o in self.shapes().values())

    def lora_params(self) -> int:
        sh = self.shapes()
        return sum(self.rank * sum(sh[m]) for layer in self.adapted for m in layer)


def layer_backward(arch: Arch, layer: int, tokens: int, needs_grad: bool, kv_only: bool = False
                   ) -> tuple[dict[str, float], bool, bool]:
    """Backward matmul FLOPs of ``tokens`` positions through one layer whose input requires grad (``needs_grad``)
    or not; ``kv_only``: only its k and v projections are on the gradient's path. Returns (FLOPs by kind,
    whether the attention's backward runs, whether the layer's output requires grad)."""
    sh, r, lora = arch.shapes(), arch.rank, set(arch.adapted[layer])
    out: Counter[str] = Counter()
    grad: dict[str, bool] = {}

    def linear(name: str, input_grad: bool) -> None:
        i, o = sh[name]
        if input_grad:
            out["linear"] += 2 * tokens * i * o
        if name in lora:  # weight grads of A and B, grad-input through B; through A when the input needs it
            out["lora"] += 2 * tokens * r * (i + 2 * o) + (2 * tokens * r * i if input_grad else 0)
        grad[name] = input_grad or name in lora

    for name in ("k_proj", "v_proj") if kv_only else READ_RESIDUAL:
        linear(name, needs_grad)
    if kv_only:
        return out, False, True
    attn = grad["q_proj"] or grad["k_proj"] or grad["v_proj"]
    linear("o_proj", attn)
    mid = needs_grad or grad["o_proj"]
    linear("gate_proj", mid)
    linear("up_proj", mid)
    linear("down_proj", grad["gate_proj"] or grad["up_proj"])
    return out, attn, mid or grad["down_proj"]


@dataclass
class MicroBatch:
    """The shape of one micro-batch as ``response_logprobs`` runs it: the shared prefix (0: none), each row's
    tokens after it (prompt rest + response) and response length."""

    prefix: int
    rests: list[int]
    responses: list[int]


def micro_batches(rows: list[tuple[list[int], list[int]]], micro_batch: int,
                  executed: bool = True) -> list[MicroBatch]:
    """The micro-batches ``ppo_update`` forms from one mini-batch of (prompt ids, response ids) rows: sorted by
    prompt then response, cut every ``micro_batch`` rows, the prefix shared by a chunk of two or more rows (the
    top level of its trie of shared prefixes, slea/policy/prefix.py). These counts model one shared level:
    with ``executed`` a chunk whose trie is deeper is refused (its executed FLOPs would be overcounted); without,
    the prefix is the one every row of the chunk shares (enough for the model FLOPs, which count every row's
    tokens whatever runs once)."""
    from slea.policy.generation import shared_prefix
    from slea.policy.prefix import build_trie

    out = []
    rows = sorted(rows)
    for start in range(0, len(rows), micro_batch):
        chunk = rows[start:start + micro_batch]
        if executed:
            trie = build_trie([p for p, _ in chunk])
            if len(trie.nodes) > 1 or (trie.nodes and min(trie.row_node) < 0):
                raise ValueError("the FLOP count models one prefix shared by every row of a micro-batch")
            n = trie.nodes[0].end if trie.nodes else 0
        else:
            n = shared_prefix([p for p, _ in chunk]) if len(chunk) > 1 else 0
        out.append(MicroBatch(n, [len(p) - n + len(c) for p, c in chunk], [len(c) for _, c in chunk]))
    return out


def step_flops(arch: Arch, batches: list[MicroBatch], executed: bool) -> dict[str, float]:
    """Matmul FLOPs of one training step over ``batches`` by kind (linear, lora, attention, head, each
    ``_fwd`` / ``_bwd``) and ``total``: model FLOPs, or with ``executed`` what the kernels run (module
    docstring)."""
    att = 2 * arch.heads * arch.head_dim  # FLOPs of one (query, key) pair in one of QKᵀ, AV
    fwd_linear = arch.frozen_per_layer() * arch.layers
    top = arch.layers - 1
    acc: Counter[str] = Counter()
    for mb in batches:
        n, b, w, k = mb.prefix, len(mb.rests), max(mb.rests), max(mb.responses)
        if executed:  # (tokens, pairs per layer, kv-only in the top layer) of each call's backward
            calls = [(b * w, b * w * (n + w), False)]
            if n:
                calls.append((n, n * n, True))
            head = b * (k + 1) + (1 if n else 0), b * (k + 1)  # forward, backward positions (prefix: one kept)
        else:
            pairs = n * (n + 1) // 2 + sum(m * n + m * (m + 1) // 2 for m in mb.rests)
            calls = [(n + sum(mb.rests), pairs, False)]
            head = sum(mb.responses), sum(mb.responses)
        for tokens, pairs, kv_top in calls:
            acc["linear_fwd"] += 2 * tokens * fwd_linear
            acc["lora_fwd"] += 2 * tokens * arch.lora_params()
            acc["attention_fwd"] += 2 * att * pairs * arch.layers
            needs_grad = False
            for layer in range(arch.layers):
                kv_only = kv_top and layer == top
                flops, attn, needs_grad_next = layer_backward(arch, layer, tokens, needs_grad, kv_only)
                for kind, v in flops.items():
                    acc[f"{kind}_bwd"] += v
                if attn:
                    acc["attention_bwd"] += (5 if executed else 4) * att * pairs
                needs_grad = needs_grad_next
        acc["head_fwd"] += 2 * head[0] * arch.hidden * arch.vocab
        acc["head_bwd"] += 2 * head[1] * arch.hidden * arch.vocab
    return {**acc, "total": sum(acc.values())}


# ---------------------------------------------------------------- measurements

def matmul_shapes(arch: Arch, rows: tuple[int, ...] = (256, 2048)) -> dict[str, tuple[int, int, int, int]]:
    """name -> (batch, M, K, N) of the benchmarked matmuls: the model's linears, LoRA's A and B, the LM head
    (256 positions) and the attention scores of every head (256 queries x 512 keys)."""
    sh = arch.shapes()
    out = {}
    for m in rows:
        for name in ("q_proj", "k_proj", "gate_proj", "down_proj"):
            out[f"{name} M={m}"] = (1, m, *sh[name])
        out[f"lora_A M={m}"] = (1, m, arch.hidden, arch.rank)
        out[f"lora_B M={m}"] = (1, m, arch.rank, arch.intermediate)
    out["lm_head M=256"] = (1, 256, arch.hidden, arch.vocab)
    out["attention scores"] = (arch.heads, 256, arch.head_dim, 512)
    return out


def matmul_window(a: torch.Tensor, b: torch.Tensor, seconds: float) -> float:
    """FLOP/s of ``torch.matmul(a, b)`` repeated for ``seconds``."""
    reps, t0 = 0, time.perf_counter()
    while reps < 2 or time.perf_counter() - t0 < seconds:
        torch.matmul(a, b)
        reps += 1
    return 2 * a.numel() * b.shape[-1] * reps / (time.perf_counter() - t0)


def measure_matmul(arch: Arch, seconds: float, windows: int = 5) -> dict:
    """GFLOP/s of every shape of :func:`matmul_shapes` in bf16 and fp32: ``windows`` windows of ``seconds`` each,
    taken in turns over all shapes (a burst of load from elsewhere then hits one window of many shapes, not every
    window of one); the best window is the shape's rate (load only ever lowers it), the median beside it."""
    shapes = matmul_shapes(arch)
    pairs = {}
    for label, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        for name, (batch, m, k, n) in shapes.items():
            a, b = torch.randn(batch, m, k).to(dtype).squeeze(0), torch.randn(batch, k, n).to(dtype).squeeze(0)
            torch.matmul(a, b)
            pairs[label, name] = (a, b)
    rates: dict[tuple[str, str], list[float]] = {key: [] for key in pairs}
    for _ in range(windows):
        for key, (a, b) in pairs.items():
            rates[key].append(matmul_window(a, b, seconds))
    res: dict = {"shapes": {name: list(s) for name, s in shapes.items()}, "windows": windows,
                 "window_s": seconds}
    for label in ("bf16", "fp32"):
        best = {name: max(rates[label, name]) / 1e9 for name in shapes}
        res[f"{label}_gflops"] = {name: round(v, 2) for name, v in best.items()}
        res[f"{label}_gflops_median"] = {name: round(statistics.median(rates[label, name]) / 1e9, 2)
                                         for name in shapes}
        res[f"peak_{label}_gflops"] = max(res[f"{label}_gflops"].values())
        res[f"peak_{label}_shape"] = max(best, key=best.get)
    return res


def kind_rates(matmul: dict, label: str = "bf16") -> dict[str, float]:
    """GFLOP/s per FLOP kind from the measured shapes: linears (the FLOP-weighted harmonic mean over q, k, gate,
    down at both M), LoRA, LM head, attention (the batched scores matmul)."""
    g = matmul[f"{label}_gflops"]

    def harmonic(names):
        w = [matmul["shapes"][x][1] * matmul["shapes"][x][2] * matmul["shapes"][x][3] for x in names]
        return sum(w) / sum(wi / g[x] for wi, x in zip(w, names))

    lin = [x for x in g if x.split()[0] in LINEARS]
    return {"linear": harmonic(lin), "lora": harmonic([x for x in g if x.startswith("lora")]),
            "head": g["lm_head M=256"], "attention": g["attention scores"]}


def counted_flops(step) -> dict:
    """FlopCounterMode's count of one ``step()``, the CPU flash-attention kernels (not in torch's table)
    counted with torch's SDPA formulas."""
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    mapping = {
        aten._scaled_dot_product_flash_attention_for_cpu:
            lambda q, k, v, *a, out_shape=None, **kw: fc.sdpa_flop_count(q, k, v),
        aten._scaled_dot_product_flash_attention_for_cpu_backward:
            lambda g, q, k, v, *a, out_shape=None, **kw: fc.sdpa_backward_flop_count(g, q, k, v),
    }
    counter = fc.FlopCounterMode(display=False, custom_mapping=mapping)
    with counter:
        step()
    return {"total": counter.get_total_flops(),
            "by_op": {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}}


def timed_calls(fn, n: int, min_cpu_per_wall: float | None = None, retries: int = 2) -> dict:
    """:func:`timed_rounds` of the one callable ``fn``."""
    return timed_rounds({"fn": fn}, n, min_cpu_per_wall, retries)["fn"]


def timed_rounds(fns: dict, n: int, min_cpu_per_wall: float | None = None, retries: int = 2) -> dict[str, dict]:
    """``n`` rounds of one call of each ``fns[key]()`` in turn (interleaved, so a drift of the machine's speed hits
    every variant alike): per key the median wall seconds, every call's wall seconds, and the process's CPU
    seconds per wall second over its calls (about the thread count when the job had the cores to itself; less: it
    waited for a core). Below ``min_cpu_per_wall`` for some key the rounds are taken again, up to ``retries``
    times, and the try whose lowest CPU per wall second is highest is kept (``tries``: how many were taken)."""
    best: dict | None = None
    for tries in range(1, 2 + (retries if min_cpu_per_wall else 0)):
        wall: dict[str, list[float]] = {k: [] for k in fns}
        cpu: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(n):
            for key, fn in fns.items():
                w0, c0 = time.perf_counter(), time.process_time()
                fn()
                cpu[key].append(time.process_time() - c0)
                wall[key].append(time.perf_counter() - w0)
        got = {k: {"s": statistics.median(wall[k]), "s_all": wall[k], "cpu_per_wall": sum(cpu[k]) / sum(wall[k])}
               for k in fns}
        low = min(g["cpu_per_wall"] for g in got.values())
        if best is None or low > min(g["cpu_per_wall"] for g in best.values()):
            best = got
        if min_cpu_per_wall is None or low >= min_cpu_per_wall:
            break
    return {k: {**v, "tries": tries} for k, v in best.items()}


def weight_cast_s(model, reps: int = 3) -> float:
    """Seconds to cast every frozen weight matrix (the linears and the tied LM head) from fp32 to bf16 once,
    median of ``reps``: what bf16 autocast does on every forward call, since it caches the casts of trainable
    leaves only (LoRA's) and casts a frozen weight again at each use."""
    frozen = [p for p in model.parameters() if not p.requires_grad and p.dim() == 2]
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for p in frozen:
            p.to(torch.bfloat16)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


STORAGES = ("fp32_base", "frozen_bf16")  # timed beside the default: model.base_dtype float32 and bfloat16
BASE_DTYPE = {"fp32_base": "float32", "bf16_linears": "bfloat16_linears", "frozen_bf16": "bfloat16"}


def policy_with(name: str, lora_layers: int, storage: str):
    """The policy with the base stored as ``storage`` (a key of :data:`BASE_DTYPE`), its adapters initialised as
    every other's (same seed)."""
    from slea.policy.model import load_policy

    torch.manual_seed(0)
    cfg = trl_step.model_section(name, lora_layers, "bfloat16").model_copy(
        update={"base_dtype": BASE_DTYPE[storage]})
    return load_policy(cfg)


def cpu_kind() -> str:
    """The CPU's model name and its native bf16 instructions (AVX-512-BF16, AMX): what sets the speed here."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                 platform.machine())
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    return (f"{model}; AVX-512-BF16: {'yes' if 'avx512_bf16' in flags else 'no'}; "
            f"AMX: {'yes' if 'amx_bf16' in flags else 'no'}")


class NoEos:
    """A tokenizer as ``HFGenerator`` sees it, without an end-of-sequence id (-1: never sampled), so that every
    row decodes ``max_new_tokens`` tokens and a timing's work does not depend on what was sampled."""

    eos_token_id = -1

    def __init__(self, tok):
        self._tok = tok

    def __getattr__(self, name):
        return getattr(self._tok, name)


def generation_what_if(name: str, lora_layers: int, reps: int, min_cpu_per_wall: float | None,
                       copies: tuple[int, ...] = (1, 16), new_tokens: int = 10) -> dict:
    """``HFGenerator`` on G copies of one turn-0 prompt (``rollout_prompts``, history 1), ``new_tokens`` per
    row, with each base storage (:data:`BASE_DTYPE`); speedups of the default (``bf16_linears``) and of
    ``frozen_bf16`` over ``fp32_base``."""
    from slea.policy.generation import HFGenerator
    from slea.policy.prompt_builder import PromptBuilder

    out: dict = {"new_tokens": new_tokens}
    calls = {}
    for label in BASE_DTYPE:
        model, tok = policy_with(name, lora_layers, label)
        gen = HFGenerator(model, NoEos(tok), dtype="bfloat16", stop_at_newline=False)
        builder = PromptBuilder(tok, history=1, obs_max_chars=300)
        batches = {g: rollout_prompts(builder, random.Random(0), 1, g, later=False) for g in copies}
        gen.generate(batches[copies[0]], max_new_tokens=2)  # warm-up
        for g, batch in batches.items():
            calls[f"{label}/G={g}"] = lambda b=batch, e=gen: e.generate(b, max_new_tokens=new_tokens)
    for key, t in timed_rounds(calls, reps, min_cpu_per_wall).items():
        out[key] = {"s": t["s"], "cpu_per_wall": t["cpu_per_wall"]}
    for g in copies:
        for label in ("bf16_linears", "frozen_bf16"):
            out[f"speedup/{label}/G={g}"] = out[f"fp32_base/G={g}"]["s"] / out[f"{label}/G={g}"]["s"]
    return out


def measure_step(name: str, shape: str, lora_layers: int, steps: int, micro: int, count: bool,
                 min_cpu_per_wall: float | None = None) -> tuple[dict, Arch]:
    from slea.policy.model import load_tokenizer

    rows = trl_step.batch(load_tokenizer(name), shape)
    model, _, step, fill_old = trl_step.slea_engine(name, rows, lora_layers, "bfloat16")
    arch = Arch.of(model)
    batches = micro_batches(rows, micro)
    others = {storage: policy_with(name, lora_layers, storage)[0] for storage in STORAGES}
    steps_of = {"default": step}
    for storage, other in others.items():  # the same step with the base stored otherwise
        _, _, steps_of[storage], fill = trl_step.slea_engine(name, rows, lora_layers, "bfloat16", model=other)
        fill()
    fill_old()
    for fn in steps_of.values():
        fn()  # warm-up
    times = timed_rounds(steps_of, steps, min_cpu_per_wall)
    t = times["default"]
    res = {"rows": len(rows), "tokens": sum(len(p) + len(c) for p, c in rows),
           "response_tokens": sum(len(c) for _, c in rows), "micro_batches": [asdict(mb) for mb in batches],
           "step_s": t["s"], "step_s_all": t["s_all"], "cpu_per_wall": t["cpu_per_wall"], "tries": t["tries"],
           "model_flops": step_flops(arch, batches, executed=False),
           "executed_flops": step_flops(arch, batches, executed=True)}
    for storage in STORAGES:
        o = times[storage]
        res[storage] = {"step_s": o["s"], "step_s_all": o["s_all"], "cpu_per_wall": o["cpu_per_wall"],
                        "speedup": o["s"] / t["s"]}  # the default's speedup over this storage
    cast = weight_cast_s(others["fp32_base"])  # what autocast casts per forward call with an fp32 base
    calls = sum(2 if mb.prefix else 1 for mb in batches)  # forward calls: the prefix's, then the rows'
    res["weight_cast"] = {"s_per_forward": cast, "forward_calls": calls, "s_per_step": cast * calls,
                          "share_of_fp32_base_step": cast * calls / res["fp32_base"]["step_s"]}
    if count:
        c = counted_flops(step)
        c["rel_diff_vs_executed"] = abs(c["total"] - res["executed_flops"]["total"]) / c["total"]
        res["flop_counter"] = c
    return res, arch


def utilisation(step: dict, matmul: dict) -> dict:
    s = step["step_s"]
    model, ex = step["model_flops"], step["executed_flops"]
    rates = kind_rates(matmul)
    bound = sum(v / (rates[key.rsplit("_", 1)[0]] * 1e9) for key, v in ex.items() if key != "total")
    return {"achieved_model_gflops": model["total"] / s / 1e9, "achieved_executed_gflops": ex["total"] / s / 1e9,
            "mfu_bf16": model["total"] / s / (matmul["peak_bf16_gflops"] * 1e9),
            **{f"mfu_bf16_{storage}": model["total"] / step[storage]["step_s"] / (matmul["peak_bf16_gflops"] * 1e9)
               for storage in STORAGES},
            "mfu_fp32": model["total"] / s / (matmul["peak_fp32_gflops"] * 1e9),
            "hfu_bf16": ex["total"] / s / (matmul["peak_bf16_gflops"] * 1e9),
            "executed_over_model": ex["total"] / model["total"], "matmul_bound_s": bound,
            "matmul_share_of_step": bound / s}


def table(res: dict) -> str:
    m = res["matmul"]
    lines = [(f"matmul peak: bf16 {m['peak_bf16_gflops']:.1f} GFLOP/s ({m['peak_bf16_shape']}), fp32 "
              f"{m['peak_fp32_gflops']:.1f} GFLOP/s ({m['peak_fp32_shape']}); {res['threads']} threads"), "",
             ("| batch | tokens | step s | CPU/wall | model GFLOP | executed GFLOP | counted GFLOP | model GFLOP/s | "
              "MFU (bf16 peak) | HFU | matmul-bound s | weight casts s |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for shape, r in res["steps"].items():
        u = r["utilisation"]
        counted = f"{r['flop_counter']['total'] / 1e9:.2f}" if "flop_counter" in r else "-"
        lines.append(f"| {shape} | {r['tokens']} | {r['step_s']:.3f} | {r['cpu_per_wall']:.2f} | "
                     f"{r['model_flops']['total'] / 1e9:.2f} | {r['executed_flops']['total'] / 1e9:.2f} | {counted} | "
                     f"{u['achieved_model_gflops']:.1f} | {u['mfu_bf16']:.1%} | {u['hfu_bf16']:.1%} | "
                     f"{u['matmul_bound_s']:.3f} | {r['weight_cast']['s_per_step']:.3f} |")
    lines += ["", "The same step with the base stored otherwise (MFU against the same peak; the default's speedup):", "",
              "| batch | base | step s | MFU (bf16 peak) | default's speedup |", "|---|---|---:|---:|---:|"]
    for shape, r in res["steps"].items():
        lines.append(f"| {shape} | default (bfloat16_linears) | {r['step_s']:.3f} | {r['utilisation']['mfu_bf16']:.1%} "
                     f"| 1.00x |")
        lines += [f"| {shape} | {BASE_DTYPE[st]} | {r[st]['step_s']:.3f} | {r['utilisation'][f'mfu_bf16_{st}']:.1%} | "
                  f"{r[st]['speedup']:.2f}x |" for st in STORAGES]
    g = res["generation_frozen_bf16"]
    lines += ["", "generation, 10 tokens per row, speedup over the float32 base: " + ", ".join(
        f"{key.split('/')[1]} {key.split('/')[2]} {v:.2f}x" for key, v in g.items() if key.startswith("speedup"))]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded", choices=["tiny", "embedded"])
    ap.add_argument("--steps", type=int, default=4, help="timed steps per batch (median), after one warm-up")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lora-layers", type=int, default=None, help="default: 15 of 30 (embedded), 1 of 2 (tiny)")
    ap.add_argument("--matmul-seconds", type=float, default=0.2, help="per window; 5 windows per shape")
    ap.add_argument("--no-count", action="store_true", help="skip the FlopCounterMode cross-check")
    ap.add_argument("--out", type=Path, default=None, help=f"default {OUT} (embedded) or a temp file (tiny)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    lora_layers = trl_step.default_lora_layers(args.model) if args.lora_layers is None else args.lora_layers
    steps, arch, load_start = {}, None, os.getloadavg()
    for shape in trl_step.SHAPES:
        r, arch = measure_step(args.model, shape, lora_layers, args.steps, trl_step.G, not args.no_count,
                               0.9 * args.threads)
        steps[shape] = r
    gen = generation_what_if(args.model, lora_layers, args.steps, 0.9 * args.threads)
    matmul = measure_matmul(arch, args.matmul_seconds)
    for r in steps.values():
        r["utilisation"] = utilisation(r, matmul)
    res = {"model": args.model, "threads": args.threads, "lora_layers": lora_layers, "torch": torch.__version__,
           "loadavg_start": load_start, "loadavg_end": os.getloadavg(),
           "cpu": cpu_kind(), "date": time.strftime("%Y-%m-%d"),
           "arch": {**asdict(arch), "adapted": [len(a) for a in arch.adapted],
                    "frozen_linear_params": arch.frozen_per_layer() * arch.layers, "lora_params": arch.lora_params()},
           "matmul": matmul, "steps": steps, "generation_frozen_bf16": gen}
    res["table"] = table(res)
    out = args.out or (OUT if args.model == "embedded" else Path(tempfile.gettempdir()) / "mfu_tiny.json")
    write_result(res, out)
    return res


if __name__ == "__main__":
    main()
