"""Seconds per iteration of the default CPU job (configs/default.yaml), short but otherwise unchanged.

Runs ``slea train configs/default.yaml`` from a source tree (``--src``: a checkout's root, default this one) for
``--iterations`` iterations with the evaluation cut to one sampled episode after training (no evaluation
before), no time budget, and reads the run's metrics.jsonl: per iteration its wall seconds and its generation,
env and training seconds, with what was played (episodes, env steps, prompt and trained tokens, return), so two
measurements of different commits can be checked to have played the same episodes (same seed, same numerics)
before their seconds are compared. The first iteration also builds the env's games: the steady-state figure is
the mean over the later ones.

    /path/to/heavy .venv/bin/python bench/cpu_iteration.py --out bench/results/gpu_path/cpu_iteration_before.json \
        --src /tmp/checkout-of-the-commit --commit SHA

Run it alone (it times a 2-core CPU job).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slea.runs.folder import RunFolder

KEEP = ("time/iteration_s", "time/generation_s", "time/env_s", "time/train_s", "train/episodes", "env_steps",
        "tokens/prompt", "tokens/generated", "tokens/trained", "train/return", "update/loss",
        "update/old_logprobs_s", "update/ratio_dev_onpolicy", "update/ratio_onpolicy_max_dev",
        "update/mismatch_dev_mean", "update/mismatch_max_dev")


def overrides(iterations: int, run_dir: Path) -> list[str]:
    """The ``--set`` list of the measurement: the default job, ``iterations`` long, minimal evaluation."""
    return [f"train.iterations={iterations}", "train.time_budget_s=null", "eval.before=false", "eval.games=1",
            "eval.episodes_per_game=1", "eval.greedy=false", f"run.dir={run_dir}"]


def summarise(rows: list[dict]) -> dict:
    """Per-iteration figures and the steady-state means (iterations after the first)."""
    its = [{k: r.get(k) for k in KEEP} for r in rows]
    later = its[1:] or its
    mean = {k: statistics.fmean(r[k] for r in later) for k in ("time/iteration_s", "time/generation_s",
                                                                "time/train_s")}
    tokens = sum(r["tokens/trained"] for r in later)
    return {"iterations": its, "steady_state_mean": mean,
            "steady_state_train_tokens_per_s": tokens / sum(r["time/train_s"] for r in later)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--set", dest="extra", action="append", default=[], help="more overrides")
    ap.add_argument("--commit", help="the commit --src holds (default: git rev-parse HEAD in --src)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--log", type=Path, help="the run's output (default: --out with .log)")
    args = ap.parse_args(argv)
    src = args.src.resolve()
    commit = args.commit or subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], check=False,
                                           capture_output=True, text=True).stdout.strip() or "unknown"
    with tempfile.TemporaryDirectory(prefix="slea-cpu-iter-") as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "slea.cli", "train", str(src / "configs/default.yaml"),
               *[a for o in overrides(args.iterations, run_dir) + args.extra for a in ("--set", o)]]
        env = {**os.environ, "PYTHONPATH": str(src / "src")}
        t0 = time.perf_counter()
        log = args.out.with_suffix(".log") if args.log is None else args.log
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as fh:  # the run's own progress lines, to follow it while it runs
            proc = subprocess.run(cmd, check=False, cwd=src, env=env, stdout=fh, stderr=subprocess.STDOUT)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"slea train failed ({proc.returncode}): see {log}")
        rows = [json.loads(line) for line in RunFolder(run_dir).metrics.read_text().splitlines() if line]
        summary = json.loads(RunFolder(run_dir).summary.read_text())
    res = {"what": "configs/default.yaml, " + " ".join(overrides(args.iterations, Path("<tmp>"))[:-1] + args.extra),
           "src": "this repository" if src == Path(__file__).resolve().parents[1] else "a checkout of the commit below",
           "commit": commit, "wall_s": wall,
           "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
           "precision": summary.get("precision"), "device": summary.get("device"), **summarise(rows)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res["steady_state_mean"], indent=1))
    return res


if __name__ == "__main__":
    main()
