"""TeamTR's comparison: TeamTR vs naive sequential training vs a single agent, 2+ seeds.

The runs are ``slea compare`` sub-runs (:mod:`slea.compare`): three variants of ``configs/teamtr.yaml`` (a
planner + actor team on TextWorld, the embedded model), each trained by the team trainer ``slea train`` picks,
under ``experiments/results/teamtr/runs/<variant>-s<seed>/``. The variants share the config and, per seed, the tasks of
every stage (:func:`slea.rollout.sampling.iteration_seeds`) and the held-out games (``eval.seed + g``, keyed sampling):

* ``teamtr`` — ``team.rollouts: fresh``: the intermediate team plays again before every single-agent update;
* ``naive`` — ``team.rollouts: stale``: naive sequential training, every update of a stage learns from the stage's
  first rollouts;
* ``single`` — ``team.task: textworld_solo_actor``: one actor alone in the same prompt layout, trained by the same
  trainer (n = 1), with ``team.max_turns`` halved so that its episodes get the same env moves as the team's (a
  planner + actor move is two messages).

So the whole comparison is (with the config's ``team.max_turns: 8``)::

    slea compare configs/teamtr.yaml --seeds 0,1,2 --out experiments/results/teamtr \
        --variant teamtr:team.rollouts=fresh --variant naive:team.rollouts=stale \
        --variant single:team.task=textworld_solo_actor,team.rollouts=fresh,team.max_turns=4

and the two share their runs. This script adds two things: one sub-run per invocation (so that on a 2-core machine
each can wait for its turn behind other heavy jobs, and each finished run can be committed as it lands), and the
team's own statistics per stage and of its trust region (``stages.md``,
``stages.json``, ``stages.png``: coordination regressions, the return after each stage). A finished run
(``eval/summary.json``) is reused, an unfinished one resumed from its newest checkpoint, a run folder trained with
another config refused (:func:`slea.compare.train_sub_run`, :func:`slea.compare.plan`)::

    python experiments/teamtr_evidence.py run --variant teamtr --seed 0
    python experiments/teamtr_evidence.py run --variant naive --seed 0
    python experiments/teamtr_evidence.py run --variant single --seed 0
    python experiments/teamtr_evidence.py table       # slea compare's table.md/json and curves.png, and stages.*
    python experiments/teamtr_evidence.py trust       # the trust region's statistics of the finished runs only

``--config`` and ``--set KEY=VALUE`` (repeatable) change the base config, for a smaller job or a test;
``$SLEA_TEAMTR_DIR`` puts the results elsewhere.
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
from slea.config import RunConfig, load_config
from slea.evaluation import stats
from slea.runs.folder import RunFolder
from slea.runs.runlog import read_metrics

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(os.environ.get("SLEA_TEAMTR_DIR") or ROOT / "experiments" / "results" / "teamtr")
CONFIG = "configs/teamtr.yaml"
SOLO_TASK = "textworld_solo_actor"
VARIANTS = {
    "teamtr": ["team.rollouts=fresh"],
    "naive": ["team.rollouts=stale"],
    "single": [f"team.task={SOLO_TASK}", "team.rollouts=fresh"],  # + team.max_turns halved (variants)
}


def variants(config: str = CONFIG, extra: list[str] | None = None) -> dict[str, list[str]]:
    """The ``slea compare`` variants: :data:`VARIANTS`, the single agent's ``team.max_turns`` half the team's (the
    config's with ``extra``), so that its episodes get the same env moves."""
    team_turns = load_config(_path(config), list(extra or []), check_unused=False).team.max_turns
    return {**VARIANTS, "single": [*VARIANTS["single"], f"team.max_turns={max(1, team_turns // 2)}"]}


def plan(seeds: list[int], config: str = CONFIG, extra: list[str] | None = None) -> compare.Plan:
    """The comparison of every variant at ``seeds`` in :data:`RESULTS` (validated, nothing trained)."""
    try:
        return compare.plan(_path(config), [], list(seeds), RESULTS, list(extra or []), variants(config, extra))
    except ValueError as exc:
        hint = " (or move it away, or set $SLEA_TEAMTR_DIR)" if "another config" in str(exc) else ""
        raise SystemExit(f"{exc}{hint}") from None


def run_dir(variant: str, seed: int) -> Path:
    return RESULTS / "runs" / compare.run_name(variant, seed)


def config_for(variant: str, seed: int, config: str = CONFIG, extra: list[str] | None = None) -> RunConfig:
    return next(cfg for sub, cfg in plan([seed], config, extra).items if sub.algorithm == variant)


def _path(config: str) -> Path:
    p = Path(config)
    return p if p.is_absolute() else ROOT / p


def train(variant: str, seed: int, config: str = CONFIG, extra: list[str] | None = None) -> str:
    """Train one sub-run (or reuse a finished one, or resume an unfinished one); returns ``"reused"``,
    ``"resumed"`` or ``"trained"``."""
    sub, cfg = next((s, c) for s, c in plan([seed], config, extra).items if s.algorithm == variant)
    status = compare.train_sub_run(sub, cfg, say=print)
    compare.relativize(RESULTS)  # any bench/ or experiments/results/<folder>/ (SLEA_TEAMTR_DIR), configs/
    if status != "reused":
        summary = json.loads(RunFolder(sub.dir).summary.read_text())
        print(f"{sub.dir}: held-out success {summary['after']['sampled']['success']:.3f} "
              f"(before {(summary['before'] or {}).get('sampled', {}).get('success', math.nan):.3f}), "
              f"{summary['wall_s'] / 60:.1f} min")
    return status


# -- reading the runs ----------------------------------------------------------------------------------------
def finished() -> list[compare.SubRun]:
    """The finished sub-runs under :data:`RESULTS`, variant by variant, seeds in order."""
    out = []
    for variant in VARIANTS:
        runs = [d for d in (RESULTS / "runs").glob(f"{variant}-s*") if RunFolder(d).summary.is_file()]
        for d in sorted(runs, key=lambda d: int(d.name.rsplit("-s", 1)[1])):
            out.append(compare.SubRun(variant, int(d.name.rsplit("-s", 1)[1]), d, "reused"))
    return out


def _rows(d: Path) -> list[dict[str, Any]]:
    return read_metrics(RunFolder(d).metrics)


def stage_curve(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per stage, the team after it (``team/return_after``, ``team/success_after`` of the stage's last update,
    i.e. the collection the whole updated team played) and before it (``team/return_before`` of its first)."""
    stages = sorted({int(r["stage"]) for r in rows})
    first = {s: next(r for r in rows if r["stage"] == s) for s in stages}
    last = {s: [r for r in rows if r["stage"] == s][-1] for s in stages}
    return {"stage": [s + 1 for s in stages],
            "return_before": [float(first[s]["team/return_before"]) for s in stages],
            "return_after": [float(last[s].get("team/return_after", math.nan)) for s in stages],
            "success_after": [float(last[s].get("team/success_after", math.nan)) for s in stages]}


def trust_stats(d: Path) -> dict[str, Any]:
    """The trust region of a run's single-agent updates (``metrics.jsonl``): the estimator and the messages d̂
    was measured on (runs from before those were logged: the config's estimator, ``None``), how many updates took
    a step and how many were reverted, the accepted d̂ (``teamtr/token_kl``) of the updates that kept their
    weights (took a step, not reverted), the largest d̂ measured after any step (``None`` where not logged) and
    each agent's β at the end (the last ``teamtr/beta_next`` of its updates)."""
    rows = _rows(d)
    stepped = [r for r in rows if r.get("teamtr/steps", 0) > 0]
    kept = [float(r["teamtr/token_kl"]) for r in stepped if not r.get("teamtr/reverted")]
    measured = [float(r["teamtr/kl_max"]) for r in stepped if "teamtr/kl_max" in r]
    cfg = load_config(RunFolder(d).config, check_unused=False) if RunFolder(d).config.is_file() else None
    estimator = next((r["teamtr/kl_estimator"] for r in rows if "teamtr/kl_estimator" in r),
                     cfg.team.trust_region.kl_estimator if cfg else None)
    # before teamtr/kl_messages was logged, d̂ was measured on the messages trained on (teamtr/samples)
    messages = [float(r.get("teamtr/kl_messages", r["teamtr/samples"])) for r in stepped]
    beta = {}
    for r in rows:
        beta[r["role"]] = float(r["teamtr/beta_next"])
    return {"kl_estimator": estimator, "updates": len(rows), "updates_stepped": len(stepped),
            "updates_reverted": sum(1 for r in stepped if r.get("teamtr/reverted")),
            "kl_accepted_min": min(kept) if kept else None, "kl_accepted_max": max(kept) if kept else None,
            "kl_measured_max": max(measured) if measured else None,
            "kl_messages_mean": float(np.mean(messages)) if messages else None,
            "trained_messages_mean": float(np.mean([r["teamtr/samples"] for r in stepped])) if stepped else None,
            "beta_final": beta}


def run_stats(r: compare.SubRun) -> dict[str, Any]:
    summary = json.loads(RunFolder(r.dir).summary.read_text())
    rows = _rows(r.dir)
    curve = stage_curve(rows)
    after, before = summary["after"], summary.get("before") or {}
    sampled, sampled0 = after.get("sampled") or {}, before.get("sampled") or {}
    regress = [a < b for a, b in zip(curve["return_after"], curve["return_before"]) if math.isfinite(a)]
    updates = [row for row in rows if "team/return_after" in row]
    return {
        "heldout_success": sampled.get("success"), "heldout_return": sampled.get("return"),
        "heldout_greedy_success": (after.get("greedy") or {}).get("success"),
        "heldout_success_before": sampled0.get("success"), "heldout_return_before": sampled0.get("return"),
        "heldout_gain": (sampled["success"] - sampled0["success"]) if sampled0 else None,
        "train_return_last": curve["return_after"][-1] if curve["return_after"] else None,
        "train_success_last": curve["success_after"][-1] if curve["success_after"] else None,
        "stage_regressions": float(np.mean(regress)) if regress else None,
        "update_regressions": float(np.mean([u["team/return_after"] < u["team/return_before"] for u in updates]))
        if updates else None,
        "episodes": float(summary["episodes"]), "updates": float(summary["updates"]),
        "stages": float(summary["stages"]), "wall_s": float(summary["wall_s"]), "curve": curve,
        "trust": trust_stats(r.dir),
    }


STATS = ("heldout_success", "heldout_return", "heldout_greedy_success", "heldout_success_before",
         "heldout_return_before", "heldout_gain", "train_return_last", "train_success_last", "stage_regressions",
         "update_regressions", "episodes", "updates", "stages", "wall_s")


def table(config: str = CONFIG, extra: list[str] | None = None) -> dict:
    """From every finished run: ``slea compare``'s ``table.md``, ``table.json`` and ``curves.png``
    (:func:`slea.compare.write_outputs`), then the team's per-stage statistics, ``stages.md``,
    ``stages.json`` and ``stages.png``; returns the latter."""
    compare.relativize(RESULTS)  # any bench/ or experiments/results/<folder>/ (SLEA_TEAMTR_DIR), configs/
    runs = finished()
    if not runs:
        raise SystemExit(f"no finished run under {RESULTS}")
    arms = variants(config, extra)
    std = compare.summarize_runs(runs)
    std["spec"] = {**_spec(sorted({r.seed for r in runs}), config, extra), "config": config}
    compare.write_outputs(std, runs, RESULTS)
    per = {(r.algorithm, r.seed): run_stats(r) for r in runs}
    tab: dict[str, Any] = {"variants": {}}
    for variant in dict.fromkeys(r.algorithm for r in runs):
        mine = {r.seed: per[(variant, r.seed)] for r in runs if r.algorithm == variant}
        tab["variants"][variant] = {"seeds": sorted(mine), **{k: compare.stat([m[k] for m in mine.values()])
                                                               for k in STATS},
                                    "per_seed": {str(s): {**{k: m[k] for k in STATS},
                                                          "train_return_per_stage": m["curve"]["return_after"],
                                                          "trust": m["trust"]}
                                                 for s, m in mine.items()}}
    tab["pairs"] = comparisons(runs)
    tab["spec"] = {"config": config, "overrides": list(extra or []), "variants": arms}
    (RESULTS / "stages.json").write_text(json.dumps(tab, indent=2))
    (RESULTS / "stages.md").write_text(markdown(tab) + "\n" + trust_markdown(tab))
    plot(runs, {k: v["curve"] for k, v in per.items()}, RESULTS / "stages.png")
    print(compare.table_markdown(std))
    print(markdown(tab))
    print(trust_markdown(tab))
    return tab


def gain(runs: list[compare.SubRun], variant: str) -> dict[str, Any]:
    """A variant's held-out success after training against before it (the untrained team on the same games, same
    sampling keys), paired by seed and game: is the gain separated from none?"""
    res = {r.seed: json.loads(RunFolder(r.dir).summary.read_text()) for r in runs if r.algorithm == variant}
    after = {s: (x.get("after") or {}) for s, x in res.items()}
    before = {s: (x.get("before") or {}) for s, x in res.items()}
    return stats.paired_comparison(
        {s: (a.get("sampled") or {}).get("success") for s, a in after.items()},
        {s: (b.get("sampled") or {}).get("success") for s, b in before.items()},
        a_games={s: stats.per_game_success(a) for s, a in after.items()},
        b_games={s: stats.per_game_success(b) for s, b in before.items()},
        names=(f"{variant} after", f"{variant} before"), metric="held-out success").to_dict()


def comparisons(runs: list[compare.SubRun]) -> list[dict[str, Any]]:
    """Every variant against teamtr on held-out success after training (:func:`slea.compare.paired`),
    then each variant's gain, after against before; each paired by seed with the exact sign-flip p and the
    bootstrap CI over seeds and held-out games."""
    variants = list(dict.fromkeys(r.algorithm for r in runs))
    out = [compare.paired(runs, v, "teamtr").to_dict() for v in variants if v != "teamtr" and "teamtr" in variants]
    out += [gain(runs, v) for v in variants]
    return [c for c in out if c["n"]]


def _spec(seeds: list[int], config: str = CONFIG, extra: list[str] | None = None) -> dict[str, Any]:
    """The spec ``slea compare`` writes for these variants and seeds; where the runs were trained with settings
    today's config no longer gives (a default changed since), the spec their table.json recorded, for a table only
    reads finished runs."""
    try:
        return compare.plan(_path(config), [], list(seeds), RESULTS, list(extra or []), variants(config, extra)).spec
    except ValueError:
        old = RESULTS / "table.json"
        if old.is_file() and json.loads(old.read_text()).get("spec"):
            return json.loads(old.read_text())["spec"]
        raise


def trust(runs: list[compare.SubRun] | None = None) -> dict[str, Any]:
    """:func:`trust_stats` of every finished run under :data:`RESULTS`, by variant (nothing is planned, so this
    also reads runs made with an older config); prints :func:`trust_markdown`."""
    runs = finished() if runs is None else runs
    if not runs:
        raise SystemExit(f"no finished run under {RESULTS}")
    tab: dict[str, Any] = {"variants": {}}
    for r in runs:
        summary = json.loads(RunFolder(r.dir).summary.read_text())
        v = tab["variants"].setdefault(r.algorithm, {"seeds": [], "per_seed": {}})
        v["seeds"].append(r.seed)
        v["per_seed"][str(r.seed)] = {"trust": trust_stats(r.dir), "wall_s": float(summary["wall_s"])}
    print(trust_markdown(tab))
    return tab


def _range(values: list[float | None], digits: int = 4) -> str:
    v = [x for x in values if x is not None]
    if not v:
        return "–"
    lo, hi = min(v), max(v)
    return f"{lo:.{digits}f}" if lo == hi else f"{lo:.{digits}f} … {hi:.{digits}f}"


def trust_markdown(tab: dict) -> str:
    """Per variant, over its seeds: the estimator, the messages d̂ was measured on and those trained per update,
    updates reverted of those that took a step, the accepted d̂ (min … max over the updates that kept a step),
    the largest d̂ measured after any step and every agent's final β (min … max)."""
    head = ["variant", "d̂ estimator", "messages measured / trained per update", "updates reverted",
            "accepted d̂ (min … max)", "largest d̂ measured", "β final (agents, min … max)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v, a in tab["variants"].items():
        ts = [m["trust"] for m in a["per_seed"].values()]
        msg = [t["kl_messages_mean"] for t in ts if t["kl_messages_mean"] is not None]
        trained = [t["trained_messages_mean"] for t in ts if t["trained_messages_mean"] is not None]
        cells = [v, ", ".join(sorted({str(t["kl_estimator"]) for t in ts})),
                 f"{np.mean(msg):.1f} / {np.mean(trained):.1f}" if msg else "–",
                 f"{sum(t['updates_reverted'] for t in ts)} / {sum(t['updates_stepped'] for t in ts)}",
                 _range([t["kl_accepted_min"] for t in ts] + [t["kl_accepted_max"] for t in ts]),
                 _range([t["kl_measured_max"] for t in ts]),
                 _range([b for t in ts for b in t["beta_final"].values()], 3)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", ("Over all seeds of a variant. Messages measured: those d̂ was averaged over (runs from before "
                   "`teamtr/kl_messages` was logged measured the messages they trained on). Accepted d̂: "
                   "`teamtr/token_kl` of the updates that took a step and kept it (not reverted); largest measured: "
                   "the largest d̂ after any step, rejected ones included (not logged by runs from before it was); an "
                   "update is reverted when it stopped outside δ and went back to its last iterate inside (the "
                   "pre-update weights at worst).")]
    return "\n".join(lines) + "\n"


def _pm(s: dict, digits: int = 3, scale: float = 1.0) -> str:
    if not s or s.get("mean") is None:
        return "–"
    if s["n"] > 1:
        return f"{s['mean'] * scale:.{digits}f} ± {s['std'] * scale:.{digits}f}"
    return f"{s['mean'] * scale:.{digits}f}"


def markdown(tab: dict) -> str:
    head = ["variant", "seeds", "held-out success", "held-out return", "greedy success", "untrained success",
            "gain (after − before)", "train return, last stage", "stages with after < before",
            "updates with after < before", "training episodes", "updates", "wall (min)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v, a in tab["variants"].items():
        cells = [v, ", ".join(map(str, a["seeds"])), _pm(a["heldout_success"]), _pm(a["heldout_return"]),
                 _pm(a["heldout_greedy_success"]), _pm(a["heldout_success_before"]), _pm(a["heldout_gain"]),
                 _pm(a["train_return_last"]), _pm(a["stage_regressions"], 2), _pm(a["update_regressions"], 2),
                 _pm(a["episodes"], 0), _pm(a["updates"], 0), _pm(a["wall_s"], 1, 1 / 60)]
        lines.append("| " + " | ".join(cells) + " |")
    spec = tab["spec"]
    lines += [
        "",
        f"Config `{spec['config']}`, overrides {spec['overrides'] or 'none'}; variants: "
        + "; ".join(f"{v}: {', '.join(o)}" for v, o in spec["variants"].items()) + ".",
        ("Mean ± std over seeds (ddof=1). Held-out: sampled episodes on the held-out games after training (greedy: one "
        "per game); untrained: the same evaluation before training, gain paired by seed. Train return, last stage: "
        "the team's mean return in the collection after the last stage. A stage (update) with after < before is a "
        "regression of the team's training return across it (naive has one `after` per stage: its per-update "
        "column counts only the last update). Training episodes: all collections (TeamTR plays n + 1 per stage, "
        "naive and single 2)."),
        "",
        "| variant | seed | untrained success | held-out success | held-out return | train return per stage |",
        "|---|---|---|---|---|---|",
    ]
    for v, a in tab["variants"].items():
        for s, m in a["per_seed"].items():
            b = m["heldout_success_before"]
            per_stage = ", ".join(f"{x:.2f}" for x in m["train_return_per_stage"])
            lines.append(f"| {v} | {s} | {'–' if b is None else f'{b:.3f}'} | {m['heldout_success']:.3f} | "
                         f"{m['heldout_return']:.3f} | {per_stage} |")
    if tab.get("pairs"):
        lines += ["", ("Held-out success paired by seed: each variant against teamtr, and each variant's gain "
                       "(after training against before):"), "", stats.markdown_table(tab["pairs"]).rstrip()]
    return "\n".join(lines) + "\n"


def plot(runs: list[compare.SubRun], curves: dict, out: Path) -> None:
    """curves.png: the team's training return and success after each stage, per variant (mean over seeds as a
    line, each seed thin); stage 0 of the return panel is the untrained team's first collection."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    panels = ((axes[0], "return_after", "team return after each stage"),
              (axes[1], "success_after", "team success after each stage"))
    for ax, key, title in panels:
        for variant in dict.fromkeys(r.algorithm for r in runs):
            mine = [curves[(r.algorithm, r.seed)] for r in runs if r.algorithm == variant]
            n = min(len(c["stage"]) for c in mine)
            ys = np.array([c[key][:n] for c in mine], dtype=np.float64)
            x = np.arange(1, n + 1)
            if key == "return_after":  # the untrained team, stage 0
                x = np.concatenate([[0], x])
                ys = np.concatenate([np.array([[c["return_before"][0]] for c in mine]), ys], axis=1)
            line = ax.plot(x, np.nanmean(ys, axis=0), marker="o", label=f"{variant} (n={len(mine)})")
            for y in ys if len(mine) > 1 else []:
                ax.plot(x, y, color=line[0].get_color(), alpha=0.25, linewidth=0.8)
        ax.set_title(f"{title} (mean over seeds; thin: seeds)")
        ax.set_xlabel("stage")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["run", "table", "trust"])
    ap.add_argument("--variant", choices=sorted(VARIANTS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides")
    a = ap.parse_args(argv)
    if a.what == "table":
        table(a.config, a.overrides)
    elif a.what == "trust":
        trust()
    elif a.variant is None:
        ap.error("--variant is needed")
    else:
        train(a.variant, a.seed, a.config, a.overrides)


if __name__ == "__main__":
    main()
