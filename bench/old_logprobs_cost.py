"""What recomputing the PPO ratio's π_old costs on the default job, and the rollout/trainer gap it removes.

Runs the default job (bench/cpu_iteration.py: configs/default.yaml, ``--iterations`` long, minimal evaluation) once
per ``algorithm.old_logprobs`` mode and writes, per mode, the steady-state seconds per iteration, the seconds of the
no-grad π_old pass (``update/old_logprobs_s``) as a share of the iteration, and the first (on-policy)
mini-batch's ``|ratio − 1|`` (mean and max). Run it alone (it times a 2-core CPU job)::

    heavy .venv/bin/python bench/old_logprobs_cost.py --out bench/results/old_logprobs_cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_iteration

MODES = ("rollout", "recompute", "tis")


def mode_summary(res: dict) -> dict:
    """Steady-state means (iterations after the first) of one mode's run."""
    later = res["iterations"][1:] or res["iterations"]

    def mean(key: str) -> float | None:
        vals = [r[key] for r in later if r.get(key) is not None]
        return statistics.fmean(vals) if vals else None

    it = mean("time/iteration_s")
    old = mean("update/old_logprobs_s")
    return {"iteration_s": it, "train_s": mean("time/train_s"), "old_logprobs_s": old,
            "old_logprobs_share": None if old is None else old / it,
            "first_minibatch_ratio_dev_mean": mean("update/ratio_dev_onpolicy"),
            "first_minibatch_ratio_dev_max": max((r.get("update/ratio_onpolicy_max_dev") or 0.0) for r in later),
            "mismatch_dev_mean": mean("update/mismatch_dev_mean"),
            "mismatch_max_dev": max((r.get("update/mismatch_max_dev") or 0.0) for r in later)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    out: dict = {"what": f"configs/default.yaml, {args.iterations} iterations per mode (bench/cpu_iteration.py)",
                 "modes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes.split(","):
            res = cpu_iteration.main(["--iterations", str(args.iterations), "--set", f"algorithm.old_logprobs={mode}",
                                      "--out", str(Path(tmp) / f"{mode}.json")])
            out["commit"] = res["commit"]
            out["modes"][mode] = {**mode_summary(res), "per_iteration": res["iterations"]}
    base = out["modes"].get("rollout", {}).get("iteration_s")
    for m in out["modes"].values():
        m["iteration_vs_rollout"] = m["iteration_s"] / base if base else None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    for name, m in out["modes"].items():
        print(name, {k: v for k, v in m.items() if k != "per_iteration"})
    return out


if __name__ == "__main__":
    main()
