"""The cost of ``train.fsdp`` on this machine: one training update of the same fixed batch in three set-ups,
measured in one invocation, every figure also as a ratio against the first:

- ``baseline``: 1 process, ``--threads`` threads (2: the machine's cores);
- ``dp``: ``slea train --nproc 2`` data parallelism, base weights replicated, ``--threads / 2`` threads each;
- ``fsdp``: the same with ``train.fsdp`` (FSDP2 shards of the frozen base weights, LoRA whole on every rank).

Each set-up runs in fresh processes (``slea.parallel.distributed.launch``: 1 or 2 spawned ranks in a gloo group),
so memory figures do not carry over. Per rank: the policy of configs/default.yaml (its ``model`` section: the
embedded SmolLM2-135M-Instruct, LoRA r16 on the top 15 of 30 layers, bf16 autocast over fp32 weights) is loaded
and, for ``fsdp``, sharded; the fixed batch is 32 rollout-shaped rows (``slea.testing.bench.rollout_prompts``:
4 tasks x 8 copies of a later turn, ~220-token prompts with the default's one-pair history, 3-6-token answers,
advantages ±1, on-policy old log-probs from a no-grad forward); the update is ``ppo_update`` with
configs/default.yaml's ``algorithm`` and ``train`` sections (4 AdamW steps over mini-batches of 8, micro-batches
of 8, β = 0), as ``Trainer.update`` calls it. After ``--warmup`` updates, ``--reps`` are timed (ranks start each
one together after a barrier; the median of rank 0's wall times is reported).

Figures per set-up:

- ``update_s``: wall time per update (``update_s_min``: the fastest); ``cpu_per_wall``: CPU seconds per wall
  second of each rank over the timed updates (about its thread count when the rank had its cores to itself);
- ``peak_rss_update_mib``: each rank's peak resident memory over the updates (``VmHWM`` reset through
  /proc/self/clear_refs just before the first update, so the model's load, which holds the whole base model on
  every rank before it is sharded, is not in it); ``peak_rss_mib``: the whole process's peak, load and gathers
  included; ``rss_loaded_mib`` / ``rss_before_update_mib``: resident memory after the load, and after sharding
  and the old log-probs;
- ``base_weights_held``: the fraction of the frozen base weights' elements a rank stores (1 when replicated);
- ``gather_s`` (``fsdp`` only, timed after the updates): one whole-model all-gather and release
  (``full_weights``), what every round of rollouts and every evaluation costs on top of the update;
- ``first_update`` and ``first_update_rel_diff``: the first update's loss and gradient norm, and their relative
  distance from the baseline's (the same update up to rounding: bf16 autocast, another grouping of the rows).
  (The LoRA weights are not compared: AdamW's first steps move every weight by about ±lr whatever its gradient's
  size, so rounding that flips a near-zero gradient moves a weight by 2 lr.)

    .venv/bin/python bench/fsdp.py [--model embedded] [--reps 3] [--warmup 1] [--out ...]

writes bench/results/fsdp.json (``--model tiny``: a temp file) and prints a table. A timing: run it alone on the
machine, through the repository's lock for heavy commands.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from slea.testing.bench import write_result

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(__file__).parent / "results" / "fsdp.json"
SETUPS = {"baseline": (1, False), "dp": (2, False), "fsdp": (2, True)}  # name: (processes, train.fsdp)
ROWS = (4, 8)  # tasks x copies of the fixed batch


def default_config(model: str):
    """configs/default.yaml with ``model`` (``tiny``: the tiny random model, its LoRA on its q/v projections)."""
    from slea.config import load_config

    over = [] if model == "embedded" else [f"model.name_or_path={model}", "model.lora_layers=null",
                                           "model.dtype=float32"]
    return load_config(ROOT / "configs" / "default.yaml", over)


def fixed_batch(tok, cfg) -> list:
    """The 32 rollout-shaped rows (module docstring), old log-probs still to fill."""
    from slea.policy.prompt_builder import PromptBuilder
    from slea.testing.bench import ROLLOUT_ACTIONS, rollout_prompts
    from slea.trainer.update import Sample

    rng = random.Random(0)
    prompts = rollout_prompts(PromptBuilder.from_rollout(tok, cfg.rollout), rng, *ROWS, later=True)
    out = []
    for i, prompt in enumerate(prompts):
        answer = tok(" " + rng.choice(ROLLOUT_ACTIONS) + "\n", add_special_tokens=False).input_ids
        out.append(Sample(prompt, answer, [0.0] * len(answer), [1.0 if i % 3 else -1.0] * len(answer)))
    return out


def fill_old_logprobs(model, samples: list, cfg) -> None:
    """On-policy old log-probs (old = current weights, as a rollout's own log-probs would be). Every rank runs
    the same forwards on the whole batch, so a sharded model's per-layer gathers stay in lockstep; no
    whole-model gather, whose freed buffers would stay in the process's heap and in the update's memory figure."""
    from slea.trainer.update import response_logprobs

    with torch.no_grad():
        for start in range(0, len(samples), cfg.train.micro_batch):
            chunk = samples[start:start + cfg.train.micro_batch]
            logp, mask = response_logprobs(model, chunk, temperature=cfg.rollout.temperature, dtype=cfg.model.dtype)
            for s, row, m in zip(chunk, logp, mask):
                s.old_logprobs = row[m.bool()].tolist()


def frozen_elements(model) -> tuple[int, int]:
    """(elements of the frozen base weights, of them this rank stores): a sharded weight's local shard."""
    full = local = 0
    for p in model.parameters():
        if not p.requires_grad:
            full += p.numel()
            local += p.to_local().numel() if hasattr(p, "to_local") else p.numel()
    return full, local


def memory_mib() -> dict[str, float]:
    """This process's resident memory now and its peak (``VmRSS``, ``VmHWM`` of /proc/self/status)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def reset_peak() -> None:
    """Start ``VmHWM`` over from the current RSS (Linux ≥ 4.0: ``5`` to /proc/self/clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed_gathers(model, reps: int) -> float:
    """Median seconds of one whole-model all-gather and release (``full_weights``) of a sharded model."""
    from slea.parallel.distributed import full_weights

    times = []
    for _ in range(reps):
        torch.distributed.barrier()
        t0 = time.perf_counter()
        with full_weights(model):
            pass
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def rank_main(setup: str, model_name: str, threads: int, warmup: int, reps: int, out: Path) -> None:
    """One rank of ``setup`` (the entry point ``launch`` spawns): load (and shard), time the updates, then (when
    sharded) the whole-model gathers; writes ``<setup>-rank<r>.json`` into ``out``."""
    from slea.parallel.distributed import DataParallel, shard_frozen_base
    from slea.policy.model import load_policy
    from slea.trainer.update import ppo_update

    torch.set_num_threads(threads)
    dp = DataParallel.current()
    cfg = default_config(model_name)
    torch.manual_seed(0)
    model, tok = load_policy(cfg.model)
    loaded = memory_mib()
    if SETUPS[setup][1]:
        shard_frozen_base(model)
    full, local = frozen_elements(model)
    samples = fixed_batch(tok, cfg)
    fill_old_logprobs(model, samples, cfg)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.train.lr,
                            betas=tuple(cfg.train.betas), weight_decay=cfg.train.weight_decay)
    first: dict[str, float] = {}

    def update() -> float:
        if dp.world > 1:
            torch.distributed.barrier()
        t0 = time.perf_counter()
        met = ppo_update(model, opt, samples, cfg.algorithm, cfg.train, temperature=cfg.rollout.temperature,
                         dtype=cfg.model.dtype, rng=random.Random(0), dp=dp)
        first.update({} if first else {k: met[k] for k in ("loss", "grad_norm")})
        return time.perf_counter() - t0

    before = memory_mib()
    reset_peak()
    for _ in range(warmup):
        update()
    c0, w0 = cpu_s(), time.perf_counter()
    times = [update() for _ in range(reps)]
    cpu_per_wall = (cpu_s() - c0) / (time.perf_counter() - w0)
    during = memory_mib()
    gather_s = timed_gathers(model, reps) if SETUPS[setup][1] else None
    res = {"rank": dp.rank, "world": dp.world, "threads": threads, "update_s": times,
           "cpu_per_wall": cpu_per_wall, "peak_rss_update_mib": during["VmHWM"],
           "peak_rss_mib": max(loaded["VmHWM"], memory_mib()["VmHWM"]), "rss_loaded_mib": loaded["VmRSS"],
           "rss_before_update_mib": before["VmRSS"],
           "base_weights": full, "base_weights_local": local, "base_weights_held": local / full,
           "gather_s": gather_s, "rows": len(samples),
           "tokens": sum(len(s.prompt_ids) + len(s.response_ids) for s in samples), "first_update": first}
    (out / f"{setup}-rank{dp.rank}.json").write_text(json.dumps(res))


def measure(setup: str, args, scratch: Path) -> dict:
    """Run ``setup`` in fresh processes; its per-rank figures and the summary over its ranks."""
    from slea.parallel.distributed import launch

    nproc = SETUPS[setup][0]
    threads = max(1, args.threads // nproc)
    launch(rank_main, nproc, setup, args.model, threads, args.warmup, args.reps, scratch)
    ranks = [json.loads((scratch / f"{setup}-rank{r}.json").read_text()) for r in range(nproc)]
    r0 = ranks[0]
    return {"processes": nproc, "fsdp": SETUPS[setup][1], "threads_per_process": threads,
            "update_s": statistics.median(r0["update_s"]), "update_s_min": min(r0["update_s"]),
            "update_s_all": r0["update_s"],
            "cpu_per_wall": [r["cpu_per_wall"] for r in ranks],
            "peak_rss_update_mib": [r["peak_rss_update_mib"] for r in ranks],
            "peak_rss_mib": [r["peak_rss_mib"] for r in ranks],
            "rss_loaded_mib": [r["rss_loaded_mib"] for r in ranks],
            "rss_before_update_mib": [r["rss_before_update_mib"] for r in ranks],
            "base_weights_held": [r["base_weights_held"] for r in ranks], "base_weights": r0["base_weights"],
            "gather_s": r0["gather_s"], "rows": r0["rows"], "tokens": r0["tokens"],
            "first_update": r0["first_update"]}


def add_ratios(results: dict[str, dict]) -> None:
    """Every figure of every set-up also as a ratio against the baseline's (per-rank lists: each rank against
    the baseline's one process), and how far the first update's loss and gradient norm are from the baseline's
    (the same update, up to rounding: bf16 autocast, another grouping of the rows)."""
    base = results["baseline"]
    for r in results.values():
        r["vs_baseline"] = {
            "update_s": r["update_s"] / base["update_s"],
            "peak_rss_update_mib": [m / base["peak_rss_update_mib"][0] for m in r["peak_rss_update_mib"]],
            "peak_rss_mib": [m / base["peak_rss_mib"][0] for m in r["peak_rss_mib"]],
            "base_weights_held": [f / base["base_weights_held"][0] for f in r["base_weights_held"]]}
        r["first_update_rel_diff"] = {k: abs(r["first_update"][k] - v) / max(abs(v), 1e-12)
                                      for k, v in base["first_update"].items()}
    results["fsdp"]["vs_dp"] = {"update_s": results["fsdp"]["update_s"] / results["dp"]["update_s"]}


def table(res: dict) -> str:
    lines = [("| set-up | update s | vs 1 proc | peak RSS in update MiB/rank | vs 1 proc | base weights held/rank | "
              "CPU/wall per rank | grad norm rel diff |"), "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in res["setups"].items():
        v = r["vs_baseline"]
        lines.append(f"| {name} ({r['processes']} x {r['threads_per_process']} thr) | {r['update_s']:.2f} | "
                     f"{v['update_s']:.2f}x | {' / '.join(f'{m:.0f}' for m in r['peak_rss_update_mib'])} | "
                     f"{' / '.join(f'{x:.2f}x' for x in v['peak_rss_update_mib'])} | "
                     f"{' / '.join(f'{f:.1%}' for f in r['base_weights_held'])} | "
                     f"{' / '.join(f'{c:.2f}' for c in r['cpu_per_wall'])} | "
                     f"{r['first_update_rel_diff']['grad_norm']:.1e} |")
    f = res["setups"]["fsdp"]
    lines.append(f"\nfsdp vs dp: {f['vs_dp']['update_s']:.2f}x the update time; one whole-model gather "
                 f"(before each round of rollouts / evaluation): {f['gather_s']:.3f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded", choices=["tiny", "embedded"])
    ap.add_argument("--reps", type=int, default=3, help="timed updates per set-up (median)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="threads of the 1-process baseline; each of 2 ranks "
                    "gets half")
    ap.add_argument("--out", type=Path, default=None, help=f"default {OUT} (embedded) or a temp file (tiny)")
    args = ap.parse_args(argv)
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="slea-bench-fsdp-") as tmp:
        scratch = Path(tmp)
        setups = {name: measure(name, args, scratch) for name in SETUPS}
    add_ratios(setups)
    cfg = default_config(args.model)
    res = {"model": args.model, "lora": {"r": cfg.model.lora_r, "alpha": cfg.model.lora_alpha,
                                         "layers": cfg.model.lora_layers, "targets": cfg.model.lora_targets},
           "dtype": cfg.model.dtype, "train": {"updates_per_iter": cfg.train.updates_per_iter,
                                              "micro_batch": cfg.train.micro_batch, "kl_coef": cfg.algorithm.kl_coef},
           "warmup": args.warmup, "reps": args.reps, "torch": torch.__version__,
           "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
           "loadavg_start": load_start, "loadavg_end": os.getloadavg(), "date": time.strftime("%Y-%m-%d"),
           "setups": setups}
    res["table"] = table(res)
    out = args.out or (OUT if args.model == "embedded" else Path(tempfile.gettempdir()) / "fsdp_tiny.json")
    write_result(res, out)
    return res


if __name__ == "__main__":
    main()
