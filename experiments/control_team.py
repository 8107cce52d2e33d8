"""The TeamTR positive control: teamtr (fresh rollouts) vs naive sequential (stale) vs stale_iw, on the ballot team.

``configs/control_team.yaml``: four members of ``ballot_volunteer`` (``slea/Ballot-v0``, a volunteer's dilemma on
private ballots) trained by the team trainer ``slea train`` picks. The variants share the config and, per seed,
the tasks of every stage and the held-out games; they differ in the rollouts each single-member update learns from
(``team.rollouts``): ``teamtr`` = fresh (the intermediate team plays again after every update), ``naive`` = stale
(every update of a stage learns from the stage's first collection), ``stale_iw`` = stale with importance weights.

Per-update coordination regressions need the team's return after *every* single-member update. TeamTR's rows carry
it (``team/return_after``: the fresh rollouts the next update learns from). The stale variants play again only
after a stage's last update, so here they also play a *probe* after each of the other updates: the intermediate
team on the stage's tasks, drawn from the random streams TeamTR's own collection at that position uses
(``draw = stage·(n+1) + position + 1``), logged as ``probe/return_after`` and ``probe/success_after`` and never
learned from (it is not counted in the run's episodes or budgets). A regression is an update whose return after
is below the return before (the collection before it: the previous update's after, or the stage's first).

One run per invocation (a long job: one at a time on a small machine); a finished run (``eval/summary.json``) is
reused, an unfinished one resumed from its newest checkpoint::

    python experiments/control_team.py run --variant teamtr --seed 0
    python experiments/control_team.py table      # table.md/json, curves.png under experiments/results/control_team/

``--set KEY=VALUE`` (repeatable) changes the config (a smaller job, a test); ``$SLEA_CONTROL_TEAM_DIR`` puts the
results elsewhere.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from slea import compare
from slea.config import RunConfig
from slea.evaluation import stats
from slea.rollout.sampling import iteration_seeds
from slea.runs import checkpoint as ckpt
from slea.runs.folder import RunFolder
from slea.runs.runlog import read_metrics

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(os.environ.get("SLEA_CONTROL_TEAM_DIR") or ROOT / "experiments" / "results" / "control_team")
CONFIG = ROOT / "configs" / "control_team.yaml"
VARIANTS = {"teamtr": ["team.rollouts=fresh"], "naive": ["team.rollouts=stale"],
            "stale_iw": ["team.rollouts=stale_iw"]}


def plan(seeds: list[int], extra: list[str] | None = None) -> compare.Plan:
    return compare.plan(CONFIG, [], list(seeds), RESULTS, list(extra or []), VARIANTS)


def probing_trainer(cfg: RunConfig, run_dir: Path):
    """The team trainer of ``cfg``, which in the stale modes also plays a probe after every update but a stage's
    last (module docstring)."""
    from slea.trainer.team import TeamTrainer, mean_return

    class ProbingTeamTrainer(TeamTrainer):
        def step(self, k: int) -> dict:
            row = super().step(k)
            if self.cfg.team.rollouts != "fresh" and "team/return_after" not in row:
                # the intermediate team after this update plays the stage's tasks once, unlearned from, with the
                # random streams TeamTR's own collection at this position draws from
                n = len(self.task.roles)
                stage, position = int(row["stage"]), int(row["position"])
                seeds = iteration_seeds(self.cfg.run.seed, stage, self.cfg.rollout.groups)
                episodes, _ = self.collector.collect(self.pool, seeds, draw=stage * (n + 1) + position + 1)
                row["probe/return_after"] = mean_return(episodes)
                row["probe/success_after"] = float(np.mean([e.trajectory.won for e in episodes]))
            return row

    return ProbingTeamTrainer(cfg, run_dir)


def run(variant: str, seed: int, extra: list[str] | None = None) -> str:
    """Train (or resume, or reuse) one run; returns ``"reused"``, ``"resumed"`` or ``"trained"``."""
    sub, cfg = next((s, c) for s, c in plan([seed], extra).items if s.algorithm == variant)
    if RunFolder(sub.dir).summary.is_file():
        print(f"{sub.dir}: finished, reused")
        return "reused"
    resume = ckpt.latest_checkpoint(RunFolder(sub.dir).checkpoints) is not None
    trainer = probing_trainer(cfg, sub.dir)
    try:
        summary = trainer.fit(resume=resume)
    finally:
        trainer.close()
    compare.relativize(RESULTS)
    print(f"{sub.dir}: held-out success {summary['after']['sampled']['success']:.3f} "
          f"(before {(summary['before'] or {}).get('sampled', {}).get('success', math.nan):.3f}), "
          f"{summary['wall_s'] / 60:.1f} min")
    return "resumed" if resume else "trained"


# -- reading the runs ------------------------------------------------------------------------------------------
def after_update(row: dict[str, Any], what: str = "return") -> float:
    """The team's ``what`` (``return`` or ``success``) on fresh rollouts after the row's update: TeamTR's own
    collection (``team/<what>_after``) or a stale variant's probe (``probe/<what>_after``); NaN where neither was
    played (a stale stage's last update)."""
    return float(row.get(f"team/{what}_after", row.get(f"probe/{what}_after", math.nan)))


def update_returns(rows: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(return before, return after) of every single-member update, both on fresh rollouts of the team at that
    point: after = the row's ``team/return_after`` or ``probe/return_after``; before = the previous update's after
    within the stage, or the stage's first collection (``team/return_before`` of its first row)."""
    out, prev_stage, before = [], None, math.nan
    for r in rows:
        if r["stage"] != prev_stage:
            prev_stage, before = r["stage"], float(r["team/return_before"])
        after = after_update(r)
        out.append((before, after))
        before = after
    return out


def stage_drifts(rows: list[dict[str, Any]]) -> list[float]:
    """How far the team an update acts on has moved from the stage's first collection, the rollouts every update
    of a stale stage learns from: for every update but a stage's first, the team return on fresh rollouts after
    the update before it minus the return of the stage's first collection. Near zero with a spread like the
    sampling noise of one collection, the stale rollouts describe the intermediate teams as well as fresh ones
    do."""
    out = []
    for stage in sorted({r["stage"] for r in rows}):
        mine = sorted((r for r in rows if r["stage"] == stage), key=lambda r: r["position"])
        first = float(mine[0]["team/return_before"])
        for r in mine[:-1]:
            after = after_update(r)
            if math.isfinite(after):
                out.append(after - first)
    return out


def regression_count(pairs: list[tuple[float, float]]) -> tuple[int, int]:
    """(updates whose team return after is below the return before, updates compared): pairs with a NaN are left
    out."""
    ok = [(b, a) for b, a in pairs if math.isfinite(a) and math.isfinite(b)]
    return sum(a < b for b, a in ok), len(ok)


def fisher_exact(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided p-value of Fisher's exact test that two counts, ``k1`` of ``n1`` and ``k2`` of ``n2``, share one
    rate: the probability, under the hypergeometric law with the margins fixed, of a table no more likely than the
    one observed (``scipy.stats.fisher_exact``)."""
    from scipy import stats as sps

    return float(sps.fisher_exact([[k1, n1 - k1], [k2, n2 - k2]], alternative="two-sided").pvalue)


def finished() -> list[compare.SubRun]:
    out = []
    for variant in VARIANTS:
        runs = [d for d in (RESULTS / "runs").glob(f"{variant}-s*") if RunFolder(d).summary.is_file()]
        out += [compare.SubRun(variant, int(d.name.rsplit("-s", 1)[1]), d, "reused")
                for d in sorted(runs, key=lambda d: int(d.name.rsplit("-s", 1)[1]))]
    return out


def run_stats(d: Path) -> dict[str, Any]:
    summary = json.loads(RunFolder(d).summary.read_text())
    rows = read_metrics(RunFolder(d).metrics)
    pairs = update_returns(rows)
    after = [a for _, a in pairs]
    success = [after_update(r, "success") for r in rows]
    before = (summary.get("before") or {}).get("sampled", {})
    return {"heldout_success": summary["after"]["sampled"]["success"],
            "heldout_games": stats.per_game_success(summary["after"]),
            "heldout_success_before": before.get("success"),
            "heldout_return": summary["after"]["sampled"]["return"], "heldout_return_before": before.get("return"),
            "update_regression_count": regression_count(pairs),
            "mean_update_change": float(np.nanmean([a - b for b, a in pairs])), "stage_drifts": stage_drifts(rows),
            "train_success_last": success[-1], "updates": len(rows), "episodes": summary["episodes"],
            "updates_reverted": sum(bool(r.get("teamtr/reverted")) for r in rows),
            # training seconds, summed over the updates' rows: the stale variants' probes (not their cost) and the
            # evaluations are not in them, and a resumed run counts every process (the committed runs' summaries
            # predate the trainers counting earlier processes in wall_s)
            "train_s": float(sum(r.get("time/stage_s", 0.0) for r in rows)),
            "wall_s": summary["wall_s"], "return_after": after, "success_after": success}


def _fmt(xs: list[float]) -> str:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return "–"
    return f"{np.mean(xs):.3f} ± {np.std(xs, ddof=1):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"


def pooled_regressions(runs: list[dict[str, Any]]) -> tuple[int, int]:
    """(regressions, updates compared) summed over ``runs`` (``run_stats`` dicts)."""
    return (sum(s["update_regression_count"][0] for s in runs), sum(s["update_regression_count"][1] for s in runs))


PAIRED = {"heldout_success": ("held-out success", "heldout_games"), "heldout_return": ("held-out return", None)}


def _paired(runs: list[dict[str, Any]], base: dict[int, dict[str, Any]], key: str, name: str = "variant"
            ) -> stats.PairedComparison:
    """``key`` (:data:`PAIRED`) of each run against teamtr's on the same seed, paired by seed over the seeds both
    have: per-seed differences, exact sign-flip p, bootstrap CI — over seeds and held-out games for success (each
    run's ``per_game_wins``), over seeds for the return (no per-game return is stored)."""
    metric, games = PAIRED[key]
    return stats.paired_comparison({s["seed"]: s[key] for s in runs}, {k: b[key] for k, b in base.items()},
                                   a_games={s["seed"]: s.get(games) for s in runs} if games else None,
                                   b_games={k: b.get(games) for k, b in base.items()} if games else None,
                                   names=(name, "teamtr"), metric=metric)


def _diff_cell(c: stats.PairedComparison) -> str:
    if not c.n:
        return "–"
    return f"{stats.format_mean_std(c)} (p = {stats.format_p(c.p)})"


def table() -> dict[str, Any]:
    """table.md / table.json (``runs``: each run's figures; ``pairs``: each variant against teamtr) and curves.png
    (the team's return and success after every update, mean over seeds with a band of ± one std) from the finished
    runs. The held-out figures are also given as the difference from
    teamtr on the same seed; every seed's regressions are pooled per variant and compared with teamtr's by
    Fisher's exact test; the drift within a stage (:func:`stage_drifts`) is pooled the same way. The training
    time sums the updates' ``time/stage_s``, so the stale variants' probes and the evaluations are left out."""
    runs = finished()
    if not runs:
        raise SystemExit(f"no finished run under {RESULTS}")
    runs_ = {f"{r.algorithm}-s{r.seed}": {"variant": r.algorithm, "seed": r.seed, **run_stats(r.dir)} for r in runs}
    lines = [("| variant | seeds | held-out success after (64 per seed) | before | − teamtr, paired by seed "
              "| held-out return after | before | − teamtr, paired by seed | per-update regressions, all seeds "
              "| Fisher p vs teamtr | mean change of the team return per update | drift within a stage, all seeds "
              "| train success after the last "
              "update | updates reverted | training time per run |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    base = {s["seed"]: s for s in runs_.values() if s["variant"] == "teamtr"}
    k0, n0 = pooled_regressions([s for s in runs_.values() if s["variant"] == "teamtr"])
    pairs = []
    for variant in VARIANTS:
        mine = [s for s in runs_.values() if s["variant"] == variant]
        if not mine:
            continue
        per_seed = ", ".join(f"s{s['seed']} {s['heldout_success']:.3f}" for s in mine)
        k, n = pooled_regressions(mine)
        vs_base = variant != "teamtr" and bool(base)
        p_vs = f"{fisher_exact(k, n, k0, n0):.2f}" if vs_base and n0 and n else "–"
        diff = {key: _paired(mine, base, key, variant) for key in PAIRED} if vs_base else {}
        pairs += list(diff.values())
        lines.append(f"| {variant} | {len(mine)} | {_fmt([s['heldout_success'] for s in mine])} ({per_seed}) | "
                     f"{_fmt([s['heldout_success_before'] for s in mine])} | "
                     f"{_diff_cell(diff['heldout_success']) if vs_base else '–'} | "
                     f"{_fmt([s['heldout_return'] for s in mine])} | {_fmt([s['heldout_return_before'] for s in mine])} | "
                     f"{_diff_cell(diff['heldout_return']) if vs_base else '–'} | "
                     f"{k} of {n}{f' ({k / n:.2f})' if n else ''} | {p_vs} | "
                     f"{_fmt([s['mean_update_change'] for s in mine])} | "
                     f"{_fmt([d for s in mine for d in s['stage_drifts']])} | "
                     f"{_fmt([s['train_success_last'] for s in mine])} | "
                     f"{sum(s['updates_reverted'] for s in mine)} / {sum(s['updates'] for s in mine)} | "
                     f"{np.mean([s['train_s'] for s in mine]) / 60:.1f} min |")
    if pairs:
        lines += ["", ("Each variant against teamtr, paired by seed (success: CI over seeds and held-out games; "
                       "return: over seeds, no per-game return is stored). The Fisher p above pools every seed's "
                       "updates as if independent; the paired p here treats the seed as the unit:"), "",
                  stats.markdown_table(pairs).rstrip()]
    (RESULTS / "table.md").write_text("\n".join(lines) + "\n")
    out = {"runs": runs_, "pairs": [c.to_dict() for c in pairs]}
    (RESULTS / "table.json").write_text(json.dumps(out, indent=2))
    _plot(runs_)
    print("\n".join(lines))
    return out


def _plot(per_run: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in ((axes[0], "return_after", "team return on fresh rollouts"),
                           (axes[1], "success_after", "team success on fresh rollouts")):
        for variant in VARIANTS:
            curves = [s[key] for s in per_run.values() if s["variant"] == variant]
            if not curves:
                continue
            n = min(len(c) for c in curves)
            y = np.array([c[:n] for c in curves], dtype=float)
            x = np.arange(1, n + 1)
            mean, sd = np.nanmean(y, 0), (np.nanstd(y, 0, ddof=1) if len(y) > 1 else np.zeros(n))
            ax.plot(x, mean, label=f"{variant} ({len(y)} seeds)")
            ax.fill_between(x, mean - sd, mean + sd, alpha=0.2)
        ax.set_xlabel("single-member update")
        ax.set_ylabel(label)
    axes[1].axhline(0.25, color="grey", ls=":", lw=1, label="random team (1/4)")
    axes[1].axhline(0.421875, color="grey", ls="--", lw=1, label="best symmetric team (0.42)")
    axes[1].set_ylim(0, 1)
    for ax in axes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "curves.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    r.add_argument("--seed", type=int, required=True)
    r.add_argument("--set", dest="extra", action="append", default=[])
    sub.add_parser("table")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        run(args.variant, args.seed, args.extra)
    else:
        table()


if __name__ == "__main__":
    main()
