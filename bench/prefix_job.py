"""The trie of shared prefixes against the common prefix alone, on the default job's own iterations.

bench/prefix_trie.py times one update on a batch built for it (turn-0 GRPO groups); this bench runs
``slea train configs/default.yaml`` itself, short (bench/cpu_iteration.py's overrides: ``--iterations``
iterations, no evaluation before, one evaluation episode after), once per arm in its own process, on the same
code:

- ``trie``: the update, the π_old pass and generation's prefill over each micro-batch's (call's) whole trie of
  shared prefixes (slea/policy/prefix.py; ``build_trie(max_depth=None)``);
- ``common_prefix``: the same with every trie cut to its first level (``build_trie(max_depth=1)``: the prompts'
  common prefix alone, the default since this bench measured the two).

The arms' trajectories part after the first numerics difference, so per-token rates are compared: trained tokens
per training second (update and π_old pass) and prompt tokens per generation second, over the iterations after
the first (which also builds the games). ``speedup`` = common_prefix's seconds per token / trie's.

    PYTHONPATH=src .venv/bin/python bench/prefix_job.py [--iterations 5] [--out FILE]

writes bench/results/prefix_job.json. Run it alone on the machine: it is a timing.
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
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_iteration import overrides
from mfu import cpu_kind

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).parent / "results" / "prefix_job.json"
ARMS = {"trie": None, "common_prefix": 1}  # build_trie's max_depth


def child(arm: str, run_dir: Path, iterations: int, extra: list[str]) -> None:
    """One arm: ``slea train`` in this process with every trie cut to ``ARMS[arm]`` levels."""
    from slea.cli import app
    from slea.policy import prefix
    from slea.trainer import update

    real = prefix.build_trie

    def cut(prompts, *_args, **_kwargs):  # every caller's trie ARMS[arm] levels deep at most
        return real(prompts, max_depth=ARMS[arm])

    sets = overrides(iterations, run_dir) + extra
    argv = ["train", str(ROOT / "configs/default.yaml"), *[a for o in sets for a in ("--set", o)]]
    with mock.patch.object(prefix, "build_trie", cut), mock.patch.object(update, "build_trie", cut):
        app(argv, standalone_mode=False)


def rates(rows: list[dict]) -> dict:
    """Seconds and tokens summed over the iterations after the first, and the per-token rates."""
    later = rows[1:] or rows
    total = {k.split("/")[1]: sum(r.get(k, 0.0) for r in later)
             for k in ("time/train_s", "update/old_logprobs_s", "time/generation_s", "tokens/trained",
                       "tokens/prompt", "time/iteration_s")}
    return {**total, "iterations": len(later),  # None: nothing trained (an untrained tiny model's equal returns)
            "trained_tokens_per_train_s": total["trained"] / total["train_s"] if total["train_s"] else None,
            "prompt_tokens_per_generation_s": total["prompt"] / total["generation_s"]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--set", dest="extra", action="append", default=[], help="more overrides")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--child", choices=list(ARMS), help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.run_dir, args.iterations, args.extra)
        return {}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=False, capture_output=True,
                            text=True).stdout.strip()
    arms = {}
    with tempfile.TemporaryDirectory(prefix="slea-prefix-job-") as tmp:
        for arm in ARMS:
            run_dir = Path(tmp) / arm
            cmd = [sys.executable, __file__, "--child", arm, "--run-dir", str(run_dir),
                   "--iterations", str(args.iterations), *[a for o in args.extra for a in ("--set", o)]]
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                           stdout=subprocess.DEVNULL)
            rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
            arms[arm] = {"wall_s": time.perf_counter() - t0, **rates(rows)}
    trie, common = arms["trie"], arms["common_prefix"]
    speedup = {what: trie[key] / common[key] if trie[key] and common[key] else None
               for what, key in (("training", "trained_tokens_per_train_s"),
                                 ("generation", "prompt_tokens_per_generation_s"))}
    res = {"what": __doc__.split("\n")[0], "commit": commit, "cpu": cpu_kind(), "date": time.strftime("%Y-%m-%d"),
           "iterations": args.iterations, "overrides": args.extra, "arms": arms, "speedup": speedup}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res["speedup"]))
    return res


if __name__ == "__main__":
    main()
