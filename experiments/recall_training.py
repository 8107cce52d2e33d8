"""The Recall control's training-split record, read from the committed run folders: what the studies' tables
(``experiments/control_recall.py table``) do not give and docs/results/control_recall.md quotes.

* **The entropy bonus** (``eight_seeds_ent0.03`` against ``eight_seeds``): per arm, each run's mean over
  iterations :data:`LATE` of ``rollout/entropy`` and of ``collapse/equal_return_frac``, second run − first run
  paired by seed: mean ± std, the exact sign-flip p and the bootstrap CI over seeds
  (:func:`slea.evaluation.stats.paired_comparison`), and over the four arms' tests of one signal Holm's adjusted p
  (:func:`holm`). ``slea_off`` is left out of the family: on this control it is ``gigpo``'s replicate, game for
  game, not a fifth arm.
* **Seed 0 of the first 8-seed run**, per arm: the token entropy at each iteration, at iteration :data:`SETTLED`
  and its lowest over :data:`LATE`, and from iteration :data:`SETTLED` on the range of the equal-return fraction
  and of the distinct first gestures per task group.
* **The held-out wins** of both 8-seed runs: per arm and seed, the held-out episodes won, of 64.
* **The 3-seed runs** (:data:`THREE_SEED`): per run, from an iteration on, the iterations whose groups all
  returned alike (``adv/abs_mean`` 0, so no update was made), the highest invalid-action rate and train success,
  the seconds of an iteration with no update against the first iteration's, and the library's strategies
  (``library/size_pos``) per iteration. These runs log no entropy or first-gesture metric, and their per-episode
  logs are not kept, so which gesture a run settled on is not in the repository.

    python experiments/recall_training.py   # writes training.md and training.json under the control's results
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from slea.evaluation import stats
from slea.runs.folder import RunFolder
from slea.runs.runlog import read_metrics

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(os.environ.get("SLEA_CONTROL_RECALL_DIR") or ROOT / "experiments" / "results" / "control_recall")
FIRST, SECOND = "eight_seeds", "eight_seeds_ent0.03"  # the second run adds algorithm.entropy_coef=0.03
ARMS = ("slea", "slea_task", "grpo", "gigpo")  # the family of the bonus tests (slea_off replicates gigpo)
ALL_ARMS = ("slea", "slea_task", "slea_off", "grpo", "gigpo")
SEEDS = tuple(range(8))
LATE = range(6, 12)  # iterations 6-11 of the 12: the pilots' and the page's late window
SIGNALS = ("rollout/entropy", "collapse/equal_return_frac")
SETTLED = 7  # iteration from which seed 0's groups are summarised
# the 3-seed studies: folder, and the iteration from which the page describes their runs
THREE_SEED = {"lr3e-4": ("compare", 5), "lr1.5e-4": ("sensitivity/lr1.5e-4/compare", 6)}
THREE_SEED_ARMS = ("slea", "grpo", "gigpo")


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), in the order given: sorted ascending, the i-th smallest
    (i = 0 … m−1) is multiplied by m − i, a running maximum keeps the adjusted values in the order of the raw ones,
    and each is capped at 1. A test is rejected at family-wise error rate α where its adjusted p is below α: the
    decisions of Holm's procedure (reject while p_(i) < α / (m − i), stop at the first that is not)."""
    p = np.asarray(pvalues, dtype=np.float64)
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, p[order] * (len(p) - np.arange(len(p))))
    out = np.empty_like(p)
    out[order] = np.maximum.accumulate(scaled)
    return [float(x) for x in out]


def _rows(study: str, arm: str, seed: int, root: Path) -> list[dict[str, Any]]:
    return read_metrics(RunFolder(root / study / "runs" / f"{arm}-s{seed}").metrics)


def _values(rows: list[dict[str, Any]], key: str, iterations: range | None = None) -> list[float]:
    return [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])
            and (iterations is None or r.get("iteration") in iterations)]


def late_mean(rows: list[dict[str, Any]], key: str) -> float | None:
    """A run's mean of ``key`` over the iterations in :data:`LATE`; None where none logs it."""
    xs = _values(rows, key, LATE)
    return float(np.mean(xs)) if xs else None


def bonus(root: Path | None = None) -> dict[str, Any]:
    """Per signal, each arm's second run − first run on its late mean, paired by seed, with Holm's adjusted p over
    the arms of :data:`ARMS`; and the late means per arm and seed."""
    root = root or RESULTS
    out: dict[str, Any] = {"late_iterations": [LATE.start, LATE.stop - 1], "family": list(ARMS), "signals": {}}
    for key in SIGNALS:
        per = {study: {arm: {s: late_mean(_rows(study, arm, s, root), key) for s in SEEDS} for arm in ALL_ARMS}
               for study in (FIRST, SECOND)}
        tests = [stats.paired_comparison(per[SECOND][arm], per[FIRST][arm], names=(f"{arm} +bonus", arm),
                                         metric=key).to_dict() for arm in ARMS]
        for t, adj in zip(tests, holm([t["p"] for t in tests])):
            t["p_holm"] = adj
        out["signals"][key] = {"tests": tests, "late_means": per}
    return out


def seed0(root: Path | None = None, study: str = FIRST) -> dict[str, Any]:
    """Seed 0 of ``study``, per arm: token entropy per iteration (nats), at iteration :data:`SETTLED`, and its
    lowest over :data:`LATE` with the iteration; from :data:`SETTLED` on, the lowest and highest equal-return
    fraction and distinct first gestures per group."""
    root = root or RESULTS
    out = {}
    for arm in ALL_ARMS:
        rows = _rows(study, arm, 0, root)
        ent = {r["iteration"]: float(r["rollout/entropy"]) for r in rows if "rollout/entropy" in r}
        lowest = min((x, i) for i, x in ent.items() if i in LATE)
        late = range(SETTLED, len(rows))
        eq, dfa = (_values(rows, k, late) for k in ("collapse/equal_return_frac", "collapse/distinct_first_actions"))
        out[arm] = {"entropy": list(ent.values()), "at_settled": ent[SETTLED], "lowest_late": list(lowest),
                    "equal_return_frac": [min(eq), max(eq)], "distinct_first_actions": [min(dfa), max(dfa)]}
    return out


def heldout_wins(root: Path | None = None) -> dict[str, dict[str, list[int]]]:
    """Per 8-seed run and arm, the held-out episodes won on each seed (``per_game_wins`` summed)."""
    root = root or RESULTS
    out: dict[str, dict[str, list[int]]] = {}
    for study in (FIRST, SECOND):
        out[study] = {}
        for arm in ALL_ARMS:
            wins = []
            for s in SEEDS:
                after = json.loads(RunFolder(root / study / "runs" / f"{arm}-s{s}").summary.read_text())
                wins.append(int(sum((after.get("after") or after)["per_game_wins"])))
            out[study][arm] = wins
    return out


def quiet(rows: list[dict[str, Any]], start: int) -> dict[str, Any]:
    """One run from iteration ``start`` on: the iterations with zero advantage (every group's episodes returned
    alike, so no update), the highest invalid-action rate and train success, the seconds of the iterations with no
    update (lowest, highest) against the first iteration's, and ``library/size_pos`` per iteration (empty without a
    library)."""
    late = [r for r in rows if r.get("iteration", -1) >= start]
    still = [r for r in late if r.get("adv/abs_mean") == 0]
    secs = [r["time/iteration_s"] for r in still if "time/iteration_s" in r]
    return {"from": start, "iterations": len(late), "no_update": [r["iteration"] for r in still],
            "invalid_max": max(r["train/invalid_rate"] for r in late),
            "success_max": max(r["train/success"] for r in late),
            "no_update_s": [min(secs), max(secs)] if secs else None,
            "first_iteration_s": rows[0].get("time/iteration_s") if rows else None,
            "strategies": [int(r["library/size_pos"]) for r in rows if "library/size_pos" in r]}


def three_seed(root: Path | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """:func:`quiet` of every run of the 3-seed studies (:data:`THREE_SEED`), keyed ``<arm>-s<seed>``."""
    root = root or RESULTS
    return {name: {f"{arm}-s{s}": quiet(read_metrics(RunFolder(root / folder / "runs" / f"{arm}-s{s}").metrics), start)
                   for arm in THREE_SEED_ARMS for s in range(3)}
            for name, (folder, start) in THREE_SEED.items()}


def _f(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:+.{digits}f}"


def markdown(b: dict[str, Any], s0: dict[str, Any], wins: dict[str, Any], three: dict[str, Any]) -> str:
    lo, hi = b["late_iterations"]
    lines = ["**The Recall control on the training split** (`python experiments/recall_training.py`)", "",
             (f"The entropy bonus: `{SECOND}` − `{FIRST}`, per arm, paired by seed (n = 8), on each run's mean over "
              f"iterations {lo}-{hi}. p: exact two-sided sign-flip over seeds; Holm: Holm's adjusted p over the "
              f"{len(b['family'])} arms' tests of that signal ({', '.join(b['family'])}; slea_off replicates gigpo); "
              "CI: percentile bootstrap over seeds."), "",
             "| signal | arm | per-seed differences | mean ± std | p | Holm p | 95% CI |", "|---|---|---|---:|---:|---:|---:|"]
    for key, sig in b["signals"].items():
        for t in sig["tests"]:
            per = ", ".join(f"s{s} {d:+.2f}" for s, d in zip(t["seeds"], t["diffs"]))
            lines.append(f"| {key} | {t['b']} | {per} | {_f(t['mean'])} ± {t['std']:.2f} | {stats.format_p(t['p'])} | "
                         f"{stats.format_p(t['p_holm'])} | {stats.format_ci(t['ci'], 2)} |")
    lines += ["", (f"Seed 0 of `{FIRST}`: token entropy per iteration (nats), at iteration {SETTLED}, and its lowest "
                   f"over iterations {lo}-{hi} (at iteration); from iteration {SETTLED} on, the lowest-highest "
                   "equal-return fraction and distinct first gestures per group:"), "",
              (f"| arm | entropy, iterations 0-11 | at {SETTLED} | lowest, {lo}-{hi} | equal returns | "
               "distinct first gestures |"),
              "|---|---|---:|---:|---:|---:|"]
    for arm, d in s0.items():
        lines.append(f"| {arm} | {' '.join(f'{x:.2f}' for x in d['entropy'])} | {d['at_settled']:.2f} | "
                     f"{d['lowest_late'][0]:.2f} ({d['lowest_late'][1]}) | "
                     f"{d['equal_return_frac'][0]:.2f}-{d['equal_return_frac'][1]:.2f} | "
                     f"{d['distinct_first_actions'][0]:.2f}-{d['distinct_first_actions'][1]:.2f} |")
    lines += ["", "Held-out episodes won, of 64 per seed (seeds 0-7):", "", "| run | arm | per seed | total | seeds with a win |",
              "|---|---|---|---:|---:|"]
    for study, arms in wins.items():
        for arm, w in arms.items():
            lines.append(f"| `{study}` | {arm} | {' / '.join(map(str, w))} | {sum(w)} | {sum(x > 0 for x in w)} |")
    lines += ["", ("The 3-seed runs: from the given iteration on, the iterations with no update (zero advantage: "
                   "every group's episodes returned alike), the highest invalid-action rate and train success, the "
                   "seconds of an iteration with no update against the first iteration's, and the library's "
                   "strategies per iteration:"), "",
              ("| study | run | from | no update | invalid max | success max | s, no update | s, iteration 0 | "
               "strategies per iteration |"), "|---|---|---:|---|---:|---:|---:|---:|---|"]
    for name, runs in three.items():
        for run, q in runs.items():
            secs = "–" if q["no_update_s"] is None else f"{q['no_update_s'][0]:.1f}-{q['no_update_s'][1]:.1f}"
            lines.append(f"| {name} | {run} | {q['from']} | {len(q['no_update'])} of {q['iterations']} "
                         f"({', '.join(map(str, q['no_update'])) or '–'}) | {q['invalid_max']:.2f} | "
                         f"{q['success_max']:.3f} | {secs} | {q['first_iteration_s']:.1f} | "
                         f"{' '.join(map(str, q['strategies'])) or '–'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None, root: Path | None = None) -> dict[str, Any]:
    """Writes ``training.json`` and ``training.md`` into ``root`` (default :data:`RESULTS`); a run folder that is
    missing ends the program with one line (exit code 2)."""
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args(argv)
    root = root or RESULTS
    missing = [f for f in (FIRST, SECOND, *(f for f, _ in THREE_SEED.values())) if not (root / f / "runs").is_dir()]
    if missing:
        print(f"recall_training: no run folders under {root} for {', '.join(missing)}", file=sys.stderr)
        raise SystemExit(2)
    try:
        b, s0, wins, three = bonus(root), seed0(root), heldout_wins(root), three_seed(root)
    except (FileNotFoundError, KeyError, ValueError) as e:
        print(f"recall_training: the committed runs under {root} are incomplete ({type(e).__name__}: {e})",
              file=sys.stderr)
        raise SystemExit(2) from None
    out = {"bonus": b, "seed0": s0, "heldout_wins": wins, "three_seed": three}
    (root / "training.json").write_text(json.dumps(out, indent=2) + "\n")
    md = markdown(b, s0, wins, three)
    (root / "training.md").write_text(md)
    print(md)
    return out


if __name__ == "__main__":
    main()
