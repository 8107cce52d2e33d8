"""The state-key gate (docs/results/state_key.md): does SLEA-RL's library speak on unseen TextWorld states when it
clusters on the env's state key, and does it speak about the right kind of state?

The runs are experiments/slea_evidence.py sub-runs of the jobs ``gate_default`` and ``gate_hard``, variants
``slea_key`` (``experience.cluster_on=state_key``) and ``slea`` (today's raw-observation clusters), seeds 0-2::

    python experiments/slea_evidence.py run --job gate_default --variant slea_key --seed 0
    python experiments/state_key_gate.py table

``table`` reads every finished run and writes ``experiments/results/evidence/gate.{md,json}``: per run the held-out
hit rate and right-state rate (sampled episodes of the final policy and library), the training split's mean Eq.5
step-group size and lesson-followed rate (over iterations), and the final library's clusters (mean members,
singleton share); then the gate's three conditions per job, each with its verdict.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

from slea.runs.runlog import read_metrics

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(os.environ.get("SLEA_EVIDENCE_DIR") or ROOT / "experiments" / "results" / "evidence")
JOBS = ("gate_default", "gate_hard")
KEY, RAW = "slea_key", "slea"
SEEDS = (0, 1, 2)
# the gate, written before any run (docs/results/state_key.md)
MIN_HIT, MIN_RIGHT, MIN_GROUP_RATIO = 0.5, 0.9, 2.0


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else math.nan


def run_figures(d: Path) -> dict[str, float] | None:
    """One finished run's figures (module docstring), or None when it has not finished."""
    summary = d / "eval" / "summary.json"
    if not summary.is_file():
        return None
    sampled = (json.loads(summary.read_text()).get("after") or {}).get("sampled") or {}
    rows = read_metrics(d / "metrics.jsonl")
    last = rows[-1] if rows else {}
    return {
        "heldout_success": sampled.get("success", math.nan),
        "heldout_hit_rate": sampled.get("retrieval_hit_rate", math.nan),
        "heldout_right_state": sampled.get("retrieval_right_state", math.nan),
        "heldout_lesson_followed": sampled.get("lesson_followed", math.nan),
        "train_step_group_size": _mean([r.get("train/step_group_size") for r in rows]),
        "train_lesson_followed": _mean([r.get("train/lesson_followed") for r in rows]),
        "cluster_members": last.get("library/cluster_members", math.nan),
        "cluster_singletons": last.get("library/cluster_singletons", math.nan),
    }


def gate(job: str, figures: dict[str, dict[int, dict[str, float]]]) -> dict[str, Any]:
    """The three conditions for one job: held-out hit rate ≥ 0.5 on every seed, right-state rate ≥ 0.9 on every
    seed, and the mean Eq.5 step-group size at least twice the raw clusters' (means over the seeds)."""
    key, raw = figures.get(KEY, {}), figures.get(RAW, {})
    done = sorted(key) == list(SEEDS)
    hits = [key[s]["heldout_hit_rate"] for s in sorted(key)]
    right = [key[s]["heldout_right_state"] for s in sorted(key)]
    size_key = _mean([key[s]["train_step_group_size"] for s in key])
    size_raw = _mean([raw[s]["train_step_group_size"] for s in raw])
    conds = {
        "hit_rate": done and all(h >= MIN_HIT for h in hits),
        "right_state": done and all(r >= MIN_RIGHT for r in right),
        "step_groups": done and sorted(raw) == list(SEEDS) and size_key >= MIN_GROUP_RATIO * size_raw,
    }
    return {"job": job, "complete": done and sorted(raw) == list(SEEDS), "conditions": conds,
            "passed": all(conds.values()), "step_group_size": {"key": size_key, "raw": size_raw}}


def _f(x: float, digits: int = 2) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def table() -> dict[str, Any]:
    out: dict[str, Any] = {"jobs": {}}
    head = ("| job | clusters on | seed | held-out success | hit rate | right state | lesson followed (held-out) | "
            "step-group size (train) | members per cluster | singletons |")
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    verdicts = []
    for job in JOBS:
        figures: dict[str, dict[int, dict[str, float]]] = {}
        for variant in (RAW, KEY):
            for seed in SEEDS:
                f = run_figures(RESULTS / job / variant / "runs" / f"slea-s{seed}")
                if f is None:
                    continue
                figures.setdefault(variant, {})[seed] = f
                lines.append(f"| {job} | {'state key' if variant == KEY else 'observation'} | {seed} | "
                             f"{_f(f['heldout_success'], 3)} | {_f(f['heldout_hit_rate'])} | "
                             f"{_f(f['heldout_right_state'])} | {_f(f['heldout_lesson_followed'])} | "
                             f"{_f(f['train_step_group_size'])} | {_f(f['cluster_members'])} | "
                             f"{_f(f['cluster_singletons'])} |")
        g = gate(job, figures)
        out["jobs"][job] = {"figures": figures, "gate": g}
        c = g["conditions"]
        verdicts.append(f"- {job}: {'complete' if g['complete'] else 'incomplete'}; hit rate ≥ {MIN_HIT} on every "
                        f"seed: {c['hit_rate']}; right state ≥ {MIN_RIGHT} on every seed: {c['right_state']}; "
                        f"step-group size {_f(g['step_group_size']['key'])} vs {_f(g['step_group_size']['raw'])} "
                        f"(≥ {MIN_GROUP_RATIO}x): {c['step_groups']}; gate {'passed' if g['passed'] else 'not passed'}")
    md = "\n".join([*lines, "", *verdicts]) + "\n"
    (RESULTS / "gate.md").write_text(md)
    (RESULTS / "gate.json").write_text(json.dumps(out, indent=2, default=float) + "\n")
    print(md)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["table"])
    ap.parse_args()
    table()


if __name__ == "__main__":
    main()
