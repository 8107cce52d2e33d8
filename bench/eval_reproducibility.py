"""Is a held-out evaluation reproducible, and how much can numerics move it?

Each evaluation runs as its own ``slea eval`` process (nothing shared but the files):

* the untrained model of ``--config`` in bf16, twice: equal numbers mean nothing outside the episode keys
  (process state, what ran before) reaches the samples;
* the same in float32: a numerical change far larger than another CPU's bf16 kernels, so the difference bounds
  what those can move;
* with ``--run RUN``: that run's last checkpoint re-evaluated from its folder, next to the run's own
  ``eval/before.json`` and ``eval/after.json`` (written inside the training process).

Writes ``bench/results/eval_reproducibility.json`` and prints a markdown table. Run it alone (``heavy``)::

    .venv/bin/python bench/eval_reproducibility.py --run runs/default
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slea.runs.folder import RunFolder

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "eval_reproducibility.json"
KEYS = ("sampled", "greedy", "per_game_wins")


def slea_eval(target: str, out: Path, *overrides: str) -> dict:
    """``slea eval TARGET`` in a fresh process; its eval-heldout.json."""
    cmd = [sys.executable, "-m", "slea.cli", "eval", target, "--out", str(out)]
    for o in overrides:
        cmd += ["--set", o]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    res = json.loads(RunFolder(out).evaluation("eval-heldout").read_text())
    return {"command": "slea eval " + " ".join([target, *(f"--set {o}" for o in overrides)]),
            "wall_s": time.perf_counter() - t0, **{k: res[k] for k in KEYS}}


def _row(name: str, r: dict) -> str:
    wins = ", ".join(map(str, r["per_game_wins"]))
    return f"| {name} | {r['sampled']['success']:.3f} | {r['greedy']['success']:.3f} | {wins} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/default.yaml")
    ap.add_argument("--run", default=None, help="a finished run folder to re-evaluate")
    args = ap.parse_args()
    runs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, dtype in (("untrained bf16, process 1", "bfloat16"), ("untrained bf16, process 2", "bfloat16"),
                            ("untrained float32", "float32")):
            runs[name] = slea_eval(args.config, Path(tmp) / name.replace(" ", "_"), f"model.dtype={dtype}")
        if args.run:
            run = Path(args.run)
            for label in ("before", "after"):
                saved = json.loads(RunFolder(run).evaluation(label).read_text())
                runs[f"{run.name}: {label}, inside the training process"] = {
                    "command": f"(written by training, {RunFolder(run).evaluation(label)})",
                    **{k: saved[k] for k in KEYS}}
            runs[f"{run.name}: re-evaluated from its folder"] = slea_eval(str(run), Path(tmp) / "rerun")
    a, b, f = (runs[k] for k in ("untrained bf16, process 1", "untrained bf16, process 2", "untrained float32"))
    episodes = int(a["sampled"]["episodes"])
    checks = {
        "bf16 processes equal": all(a[k] == b[k] for k in KEYS),
        "float32: net change in sampled wins": round(abs(f["sampled"]["success"] - a["sampled"]["success"])
                                                          * episodes),
        "sampled episodes": episodes,
    }
    if args.run:
        name = Path(args.run).name
        after, again = runs[f"{name}: after, inside the training process"], runs[f"{name}: re-evaluated from its folder"]
        before = runs[f"{name}: before, inside the training process"]
        checks["re-evaluation equals after.json"] = all(after[k] == again[k] for k in KEYS)
        checks["untrained bf16 equals the run's before.json"] = all(a[k] == before[k] for k in KEYS)
    result = {"config": args.config, "date": time.strftime("%Y-%m-%d"), "checks": checks, "runs": runs}
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print("| evaluation | sampled success | greedy success | per-game wins |\n|---|---:|---:|---|")
    for name, r in runs.items():
        print(_row(name, r))
    print(json.dumps(checks, indent=2))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
