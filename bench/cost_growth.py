"""How slea's costs grow with group size, number of groups, history length and library size, with slea's own
components (the embedded model with the default preset's LoRA on the top 15 layers, bf16, 2 threads):

(a) generation (``HFGenerator``, 10 new tokens, no stop at a newline or at EOS (bench/mfu.py's ``NoEos``), so
    every row decodes all 10 and a point's work does not depend on what was sampled) of turn-0 prompts of the
    default job's shape (``PromptBuilder`` with history 1, obs_max_chars 300; bench/throughput.py's prompts,
    ``slea.testing.bench.rollout_prompts``):
    G copies of one prompt, G = 1, 2, 4, 8, 16; and g groups of 8 copies (g distinct prompts), g = 1, 2, 4, 8.
    Wall time, median of ``--reps`` after a warm-up call, with CPU seconds per wall second (bench/mfu.py's
    ``timed_calls``: about the thread count when the job had the cores to itself; a point below 0.9 x threads
    is timed again, twice at most, keeping the try with the most CPU).
(b) one training step (``ppo_update`` through bench/trl_step.py's ``slea_engine``, as bench/mfu.py times it, on
    the model (a) generated with: one model for the whole script, since step times moved by up to 30 % from one
    freshly loaded model to the next) on 8 rows of distinct prompts built by ``PromptBuilder`` with h = 0, 1, 2,
    4, 8, 16 past (observation, action) turns, the observations real TextWorld ones (256 drawn from
    bench/data/textworld_obs.jsonl.gz, cleaned as slea's anchors; past ones clipped to 150 characters by the
    builder), each answer one of the prompts' commands (3-5 tokens); median of ``--reps`` after a warm-up
    step; with its model FLOPs (bench/mfu.py's count) and the FLOP rate they give.
(c) retrieval (``Retriever.retrieve``, top 2 positive + 1 negative, 200 tokens) from libraries of 1k, 10k and 100k
    synthetic entries (bench/retrieval.py's ``synthetic_library``), per call on 1,000 real observations (a
    seeded sample of the corpus), after a first Eq.2 call that builds the library's token matrix (timed on its
    own: it is paid again after every change to the library): Eq.1 with the cluster given (``share_eq1``: the
    share answered from the cluster's entries; a cluster with none falls back to Eq.2), and the Eq.2 fallback
    alone; thread CPU time, mean / p50 / p99.

Each curve gets the slope of a least-squares line through its points on log-log axes (1: linear growth, 0: flat;
the training step also against its model FLOPs). Writes bench/results/cost_growth.json and its 2x2 plot
bench/results/cost_growth.png (``--out``; ``--model tiny --quick`` is a smoke run of the whole driver into a temp
folder). ``--parts`` re-measures a subset (generation, training, library) and keeps the other sections of the
JSON; ``--plot-only`` re-draws the plot, and recomputes the slopes, from it.

    PYTHONPATH=src .venv/bin/python bench/cost_growth.py [--reps 3] [--quick] [--parts ...] [--plot-only]

Run it alone on the machine: it is a timing.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from slea.testing.bench import ROLLOUT_ACTIONS, rollout_prompts

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mfu  # bench/mfu.py: the step's FLOP count
import retrieval  # bench/retrieval.py: the corpus and the synthetic library
import trl_step  # bench/trl_step.py: slea's update step on fixed rows

OUT = Path(__file__).parent / "results" / "cost_growth.json"
FULL = {"group_sizes": [1, 2, 4, 8, 16], "groups": [1, 2, 4, 8], "history": [0, 1, 2, 4, 8, 16],
        "library": [1_000, 10_000, 100_000], "queries": 1_000}
QUICK = {"group_sizes": [1, 2, 4], "groups": [1, 2], "history": [0, 2], "library": [200, 1_000], "queries": 100}
GROUP_SIZE = 8  # copies per group in the groups sweep: the default job's rollout.group_size
NEW_TOKENS = 10  # the default job's rollout.max_new_tokens


def slope(xs, ys) -> float:
    """Least-squares slope of log y on log x."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def generation(model, tok, sizes: dict, reps: int, min_cpu: float) -> dict:
    from slea.policy.generation import HFGenerator
    from slea.policy.prompt_builder import PromptBuilder

    builder = PromptBuilder(tok, history=1, obs_max_chars=300)
    gen = HFGenerator(model, mfu.NoEos(tok), dtype="bfloat16", stop_at_newline=False)
    rng = random.Random(0)

    def run(batch):
        out = gen.generate(batch, max_new_tokens=NEW_TOKENS)
        assert all(len(g.ids) == NEW_TOKENS for g in out)
        return out

    run(rollout_prompts(builder, rng, 1, 2, later=False))  # warm-up
    out = {}
    for key, xs, shape in (("group_size", sizes["group_sizes"], lambda x: (1, x)),
                           ("groups", sizes["groups"], lambda x: (x, GROUP_SIZE))):
        points = []
        for x in xs:
            tasks, copies = shape(x)
            batch = rollout_prompts(builder, rng, tasks, copies, later=False)
            t = mfu.timed_calls(lambda b=batch: run(b), reps, min_cpu)
            s = t["s"]
            points.append({key: x, "rows": len(batch), "distinct_prompts": len({tuple(p) for p in batch}),
                           "prompt_tokens": len(batch[0]), "s": s, "ms_per_row": 1e3 * s / len(batch),
                           "s_all": t["s_all"], "cpu_per_wall": t["cpu_per_wall"], "tries": t["tries"]})
            print(f"[generation] {key} {x}: {len(batch)} rows {s:.3f} s", flush=True)
        out[key] = {"points": points}
    return out


def training(model, name: str, tok, lora_layers: int, sizes: dict, reps: int, observations: list[str],
             min_cpu: float) -> dict:
    from slea.policy.prompt_builder import PromptBuilder

    rng = random.Random(1)
    points = []
    for h in sizes["history"]:
        builder = PromptBuilder(tok, history=h, obs_max_chars=300)
        batch = rollout_prompts(builder, rng, trl_step.G, 1, later=h > 0, turns=h, observations=observations)
        answers = [tok(" " + rng.choice(ROLLOUT_ACTIONS) + "\n", add_special_tokens=False).input_ids
                   for _ in batch]
        rows = list(zip(batch, answers))
        _, _, step, fill_old = trl_step.slea_engine(name, rows, lora_layers, "bfloat16", model=model)
        fill_old()
        step()  # warm-up
        t = mfu.timed_calls(step, reps, min_cpu)
        s = t["s"]
        batches = mfu.micro_batches(rows, trl_step.G, executed=False)  # model FLOPs only
        flops = mfu.step_flops(mfu.Arch.of(model), batches, executed=False)["total"]
        points.append({"history": h, "rows": len(rows), "mean_prompt_tokens": sum(map(len, batch)) / len(batch),
                       "shared_prefix": batches[0].prefix, "tokens": sum(len(p) + len(c) for p, c in rows),
                       "s": s, "model_gflop": flops / 1e9, "model_gflops_per_s": flops / s / 1e9,
                       "s_all": t["s_all"], "cpu_per_wall": t["cpu_per_wall"], "tries": t["tries"]})
        print(f"[training] history {h}: {points[-1]['mean_prompt_tokens']:.0f} prompt tokens, {s:.3f} s", flush=True)
        del step, fill_old
        gc.collect()
    return {"points": points}


def library(sizes: dict, streams) -> dict:
    from slea.experience.retrieval import Retriever

    stream = streams["clean"]
    rng = random.Random(2)
    queries = random.Random(3).sample(stream, min(sizes["queries"], len(stream)))
    points = []
    for n in sizes["library"]:
        t0 = time.perf_counter()
        lib, idx = retrieval.synthetic_library(stream, n, rng)
        build_s = time.perf_counter() - t0
        r = Retriever(lib, top_k_pos=2, top_k_neg=1, max_tokens=200)
        gc.collect()
        c0 = time.thread_time()  # the first Eq.2 call builds the library's token matrix (once per content version)
        r.retrieve(queries[0][1], -1, task_type=queries[0][0], link=False)
        first_eq2_us = (time.thread_time() - c0) * 1e6
        given = [(o, idx.lookup(o, t), t) for t, o in queries]
        res, wall, cpu = retrieval.timed(lambda o, c, t, r=r: r.retrieve(o, c, task_type=t, link=False), given)
        _, fwall, fcpu = retrieval.timed(lambda o, t, r=r: r.retrieve(o, -1, task_type=t, link=False),
                                         [(o, t) for t, o in queries])
        points.append({"entries": len(lib), "build_s": build_s, "first_eq2_call_cpu_us": first_eq2_us,
                       "eq1_given_cluster": retrieval.both(wall, cpu), "eq2_fallback": retrieval.both(fwall, fcpu),
                       "share_eq1": sum(bool(x.entry_ids) and not x.fallback for x in res) / len(res)})
        print(f"[retrieval] {n}: first Eq.2 call {first_eq2_us:.0f} us; then eq1 cpu "
              f"{points[-1]['eq1_given_cluster']['cpu']}, eq2 cpu {points[-1]['eq2_fallback']['cpu']}", flush=True)
        lib.conn.close()
    return {"points": points, "queries": len(queries)}


def add_slopes(res: dict) -> None:
    """The growth exponents of ``res``'s curves (log-log slopes), from its points."""
    g, t, lib = res["generation"], res["training"], res["library"]
    for key in ("group_size", "groups"):
        g[key]["slope"] = slope([p[key] for p in g[key]["points"]], [p["s"] for p in g[key]["points"]])
    for key, x in (("slope_vs_prompt_tokens", "mean_prompt_tokens"), ("slope_vs_model_flops", "model_gflop")):
        t[key] = slope([p[x] for p in t["points"]], [p["s"] for p in t["points"]])
    xs = [p["entries"] for p in lib["points"]]
    for key in ("eq1_given_cluster", "eq2_fallback"):
        for stat in ("mean", "p50", "p99"):
            lib[f"slope_{key}_{stat}"] = slope(xs, [max(p[key]["cpu"][f"{stat}_us"], 1e-3) for p in lib["points"]])
    if all("first_eq2_call_cpu_us" in p for p in lib["points"]):
        lib["slope_first_eq2_call"] = slope(xs, [p["first_eq2_call_cpu_us"] for p in lib["points"]])


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    fig, ax = plt.subplots(2, 2, figsize=(11, 8.5))
    g = res["generation"]
    for a, key, label in ((ax[0, 0], "group_size", "(a1) G copies of one prompt"),
                          (ax[0, 1], "groups", f"(a2) g distinct prompts x {GROUP_SIZE} copies")):
        pts = g[key]["points"]
        xs, ys = [p[key] for p in pts], [p["s"] for p in pts]
        a.plot(xs, ys, "o-", label=f"slea HFGenerator (slope {g[key]['slope']:.2f})")
        a.plot(xs, [ys[0] * x / xs[0] for x in xs], "k:", label="linear in rows")
        for p in pts:
            a.annotate(f"{p['rows']} row{'s' if p['rows'] > 1 else ''}", (p[key], p["s"]), textcoords="offset points",
                       xytext=(4, -10), fontsize=8)
        a.set(xscale="log", yscale="log", xlabel=key.replace("_", " "), ylabel="generation, s",
              title=f"{label}, {NEW_TOKENS} new tokens")
        a.set_xticks(xs, [str(x) for x in xs])
    t = res["training"]["points"]
    xs, ys = [p["mean_prompt_tokens"] for p in t], [p["s"] for p in t]
    a = ax[1, 0]
    a.plot(xs, ys, "o-", label=f"ppo_update, 8 rows (slope {res['training']['slope_vs_prompt_tokens']:.2f}; "
                               f"{res['training']['slope_vs_model_flops']:.2f} vs model FLOPs)")
    a.plot(xs, [ys[0] * x / xs[0] for x in xs], "k:", label="linear in prompt tokens")
    a.plot(xs, [ys[0] * p["model_gflop"] / t[0]["model_gflop"] for p in t], "g--",
           label="model FLOPs (bench/mfu.py), scaled to h=0")
    for p in t:
        a.annotate(f"h={p['history']}", (p["mean_prompt_tokens"], p["s"]), textcoords="offset points",
                   xytext=(4, -10), fontsize=8)
    a.set(xscale="log", yscale="log", xlabel="prompt tokens per row (history turns h)", ylabel="training step, s",
          title="(b) one update step vs history length")
    lib = res["library"]
    a = ax[1, 1]
    xs = [p["entries"] for p in lib["points"]]
    for key, label in (("eq1_given_cluster", "Eq.1, cluster given"), ("eq2_fallback", "Eq.2 fallback")):
        for stat, style in (("p50", "o-"), ("p99", "s--")):
            a.plot(xs, [max(p[key]["cpu"][f"{stat}_us"], 1e-1) for p in lib["points"]], style,
                   label=f"{label}, {stat} (slope {lib[f'slope_{key}_{stat}']:.2f})")
    if "slope_first_eq2_call" in lib:
        a.plot(xs, [p["first_eq2_call_cpu_us"] for p in lib["points"]], "k^-",
               label=f"first Eq.2 call: builds the token matrix (slope {lib['slope_first_eq2_call']:.2f})")
    a.set(xscale="log", yscale="log", xlabel="library entries", ylabel="retrieve, µs (CPU)",
          title=f"(c) retrieval vs library size, {lib['queries']} queries")
    ax[1, 0].set_xticks([round(p["mean_prompt_tokens"]) for p in t])
    for a in ax.flat:
        a.yaxis.set_major_locator(LogLocator(subs=(1.0,) if a is ax[1, 1] else (1.0, 2.0, 3.0, 5.0)))
        for axis in (a.xaxis, a.yaxis):
            axis.set_major_formatter(ScalarFormatter())
            axis.set_minor_formatter(NullFormatter())
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=7 if a is ax[1, 1] else 8)
    fig.suptitle(f"slea cost growth: {res['model']}, {res['threads']} threads, {res['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded", choices=["tiny", "embedded"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="small sweeps (a smoke run)")
    ap.add_argument("--plot-only", action="store_true", help="re-draw the plot (and the slopes) from --out")
    ap.add_argument("--parts", default="generation,training,library",
                    help="comma-separated subset to (re)measure; the other sections are kept from --out")
    ap.add_argument("--out", type=Path, default=None, help=f"default {OUT} (embedded) or a temp file (tiny)")
    args = ap.parse_args(argv)
    out = args.out or (OUT if args.model == "embedded" else Path(tempfile.gettempdir()) / "cost_growth_tiny.json")
    if args.plot_only:
        res = json.loads(out.read_text())
        add_slopes(res)
        out.write_text(json.dumps(res, indent=1))
        plot(res, out.with_suffix(".png"))
        return res
    from slea.policy.model import load_policy

    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    sizes = QUICK if args.quick else FULL
    lora_layers = trl_step.default_lora_layers(args.model)
    t0 = time.perf_counter()
    streams = retrieval.load_streams()
    res = json.loads(out.read_text()) if set(parts) != {"generation", "training", "library"} else {}
    run = {"model": args.model, "threads": args.threads, "lora_layers": lora_layers, "reps": args.reps,
           "loadavg_start": list(os.getloadavg()), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
           "sizes": sizes, "parts": parts}
    if res and "run_by_part" not in res:  # a file from before run_by_part: its sections are one run's
        res["run_by_part"] = {p: {k: res[k] for k in run if k in res} for p in ("generation", "training", "library")}
    if {"generation", "training"} & set(parts):  # one model for both: points compare within one process
        model, tok = load_policy(trl_step.model_section(args.model, lora_layers, "bfloat16"))
    if "generation" in parts:
        res["generation"] = generation(model, tok, sizes, args.reps, 0.9 * args.threads)
    if "training" in parts:
        observations = random.Random(4).sample([o for _, o in streams["clean_textworld"]], 256)
        res["training"] = training(model, args.model, tok, lora_layers, sizes, args.reps, observations,
                                   0.9 * args.threads)
    if "library" in parts:
        res["library"] = library(sizes, streams)
    add_slopes(res)
    run["seconds"] = time.perf_counter() - t0
    run["loadavg_end"] = list(os.getloadavg())
    res.update(run)  # the latest run; run_by_part: the run that measured each section
    res.setdefault("run_by_part", {}).update({p: run for p in parts})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    plot(res, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')} ({run['seconds']:.0f} s)")
    return res


if __name__ == "__main__":
    main()
