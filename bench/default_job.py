"""The default job end to end, this checkout against a baseline commit, one after the other in one command.

Each arm runs ``slea train CONFIG`` (``configs/default.yaml``: 14 iterations between held-out evaluations) as a
user would, with the package and config of its own checkout, each a temporary ``git worktree``: ``--baseline``
and this checkout's HEAD when the bench starts (what is not committed is not measured). ``wall_s`` is the
command's, from start to exit (model load, both evaluations and every iteration); the time split sums
``metrics.jsonl``'s ``time/*`` keys and ``update/old_logprobs_s`` (the no-grad π_old pass) over the iterations;
held-out success is ``eval/summary.json``'s, before and after. ``speedup`` = baseline / current for every time.

    PYTHONPATH=src .venv/bin/python bench/default_job.py --baseline 170fd6a [--out FILE] [--config FILE]

writes bench/results/default_job.json (``--out``). Run it alone on the machine: it is a timing (about 25 minutes
on 2 cores).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mfu import cpu_kind

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).parent / "results" / "default_job.json"
TIME_KEYS = ("time/iteration_s", "time/train_s", "time/generation_s", "time/env_s", "update/old_logprobs_s")


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def run_arm(checkout: Path, config: str, run_dir: Path, threads: int) -> dict:
    """``slea train`` of ``checkout``'s package on ``checkout``'s ``config``: wall seconds, time split, held-out
    success."""
    env = {**os.environ, "PYTHONPATH": str(checkout / "src")}
    cmd = [sys.executable, "-m", "slea.cli", "train", str(checkout / config), "--set", f"run.dir={run_dir}",
           "--set", f"run.threads={threads}"]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=checkout, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    return {
        "wall_s": round(wall, 1),
        "iterations": len(rows),
        **{key.split("/")[1]: round(sum(r.get(key, 0.0) for r in rows), 2) for key in TIME_KEYS},
        "trained_tokens": sum(int(r.get("tokens/trained", 0)) for r in rows),
        "held_out": {when: {mode: summary[when][mode]["success"] for mode in ("sampled", "greedy")}
                     for when in ("before", "after")},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="the commit to compare with")
    ap.add_argument("--config", default="configs/default.yaml")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    head = git("rev-parse", "--short", "HEAD")
    base = git("rev-parse", "--short", args.baseline)
    arms = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arm, commit in (("baseline", base), ("current", head)):
            tree = Path(tmp) / arm
            git("worktree", "add", "--detach", str(tree), commit)
            try:
                arms[arm] = {"commit": commit, **run_arm(tree, args.config, Path(tmp) / "runs" / arm, args.threads)}
            finally:
                git("worktree", "remove", "--force", str(tree))
    speed = {key: round(arms["baseline"][key] / arms["current"][key], 3)
             for key in ("wall_s", "iteration_s", "train_s", "old_logprobs_s", "generation_s")
             if arms["current"][key]}
    out = {"what": __doc__.splitlines()[0], "config": args.config, "threads": args.threads,
           "cpu": cpu_kind(), "measured": time.strftime("%Y-%m-%d"), "arms": arms, "speedup": speed}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(speed))


if __name__ == "__main__":
    main()
