"""``slea compare``: several algorithms × seeds on one config, side by side, resumable.

Every sub-run ``<out>/runs/<algo>-s<seed>/`` is an ordinary run folder trained from the same config with
``algorithm.name=<algo>`` and ``run.seed=<seed>`` (plus the config values the algorithm declares at
registration, ``AlgorithmSpec.defaults``, where the config does not set them, and the user's ``--set``
overrides). A setting only some of the compared algorithms read is accepted for the others (the refusal of
unused settings checks it against the whole comparison). So for a given seed every algorithm plays the same task groups in
every iteration (``rl.iteration_seeds`` depends on the run seed and the iteration only), with the same number
of iterations, groups and copies, and is evaluated on the same held-out games. Env steps are counted, not
assumed equal (an episode may end early; dynamic sampling plays extra groups), and the table compares train
success at equal env-step budgets.

Every sub-run is trained by the trainer ``slea train`` would run for it (:func:`slea.trainer.select.
build_trainer`: the single-agent loop, or the TeamTR stage loop for an algorithm that needs a team, whose
metrics rows are single-agent updates carrying the same ``env_steps``/``rollouts``/``train/success`` columns).
A value a sub-run does not record is shown as "–".

Reuse: a sub-run with ``eval/summary.json`` is finished and is read, not recomputed; one with a checkpoint
resumes from it (``fit(resume=True)``); a sub-run whose saved config differs from the one this
invocation would use is an error (use another ``--out``), so a folder never mixes settings.

Outputs in ``<out>``: ``table.md`` and ``table.json`` (held-out success after training, mean ± std over
seeds; train success interpolated at common env-step budgets; env steps; rollouts, one per whole episode or
RTPO sibling continuation; wall time), ``curves.png`` (train
success and return against env steps: the mean over seeds with a 95% confidence band), ``compare.json`` (the
spec of the comparison).
"""

from __future__ import annotations

import gc
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from slea.algorithms.registry import get_algorithm
from slea.atomic import atomic_write_text
from slea.config import ConfigError, RunConfig, dump_config, load_config, unused_settings
from slea.trainer.runlog import read_metrics

__all__ = ["Plan", "SubRun", "compare", "env_step_curve", "plan", "run", "summarize_runs", "write_outputs"]

BUDGET_FRACTIONS = (0.25, 0.5, 0.75, 1.0)


@dataclass
class SubRun:
    algorithm: str
    seed: int
    dir: Path
    status: str = ""  # "reused", "resumed" or "trained"


def run_name(algorithm: str, seed: int) -> str:
    return f"{algorithm}-s{seed}"


def sub_config(config: str | Path | None, algorithm: str, seed: int, overrides: list[str], run_dir: Path
               ) -> RunConfig:
    over = [f"algorithm.name={algorithm}", f"run.seed={seed}", *overrides,
            f"run.dir={run_dir}", f"run.name={run_name(algorithm, seed)}"]
    return load_config(config, over, check_unused=False)


def _check_unused(cfgs: list[RunConfig]) -> None:
    """A setting no algorithm of the comparison reads is refused, as ``slea train`` refuses it for one."""
    unused = [unused_settings(c) for c in cfgs]
    for key, why in unused[0].items():
        if all(key in u for u in unused):
            raise ConfigError(f"{key}: {why}" + (" (nor by the other compared algorithms)" if len(cfgs) > 1 else ""))


def config_diff(saved: Path, cfg: RunConfig, free: tuple[tuple[str, str], ...] = (("run", "dir"), ("run", "name"))
                ) -> list[str]:
    """The ``section.key`` settings where a run's saved config.yaml differs from ``cfg``, less ``free``; keys only
    one side has (a newer or an older slea) are not a change. A top-level value that is no section (``plugins``,
    a list) is compared whole, by its own name."""
    old = yaml.safe_load(Path(saved).read_text()) or {}
    new = yaml.safe_load(dump_config(cfg))
    out = []
    for sec in sorted(set(old) & set(new)):
        a, b = old[sec] or {}, new[sec] or {}
        if not (isinstance(a, dict) and isinstance(b, dict)):
            out += [sec] if a != b else []
            continue
        out += [f"{sec}.{key}" for key in sorted(set(a) & set(b)) if (sec, key) not in free and a[key] != b[key]]
    return out


def same_config(saved: Path, cfg: RunConfig) -> tuple[bool, str]:
    """Whether a sub-run's saved config.yaml is the config this invocation would train with."""
    diff = config_diff(saved, cfg)
    if not diff:
        return True, ""
    old, new = yaml.safe_load(Path(saved).read_text()) or {}, yaml.safe_load(dump_config(cfg))
    sec, _, key = diff[0].partition(".")
    there, now = (old[sec], new[sec]) if not key else (old[sec][key], new[sec][key])
    return False, f"{diff[0]}: {there!r} there, {now!r} now"


@dataclass
class Plan:
    """A validated comparison: the output folder, its spec, and every sub-run with its config."""

    out: Path
    spec: dict[str, Any]
    items: list[tuple[SubRun, RunConfig]]


def plan(config: str | Path | None, algorithms: list[str], seeds: list[int], out: str | Path,
         overrides: list[str] | None = None) -> Plan:
    """Resolve and validate every sub-run's config before anything trains (a typo fails fast, not after
    hours). Raises ``ConfigError`` for a bad config and ``ValueError`` for a bad spec or an ``out`` folder
    holding a sub-run trained with different settings."""
    out = Path(out)
    overrides = list(overrides or [])
    if not algorithms or not seeds:
        raise ValueError("compare needs at least one algorithm and one seed")
    if len(set(algorithms)) != len(algorithms) or len(set(seeds)) != len(seeds):
        raise ValueError("algorithms and seeds must not repeat")
    items = []
    for algo in algorithms:
        for seed in seeds:
            d = out / "runs" / run_name(algo, seed)
            cfg = sub_config(config, algo, seed, overrides, d)
            if (d / "config.yaml").is_file():
                same, why = same_config(d / "config.yaml", cfg)
                if not same:
                    raise ValueError(f"{d} was trained with another config ({why}); use another --out")
            items.append((SubRun(algo, seed, d), cfg))
    _check_unused([cfg for _, cfg in items])
    from slea.trainer.select import check_config

    for _, cfg in items:  # the chosen trainer's own checks (a team trainer's), before any sub-run trains
        check_config(cfg)
    defaults = {a: dict(get_algorithm(a).defaults) for a in algorithms if get_algorithm(a).defaults}
    spec = {"config": str(config) if config else None, "algorithms": list(algorithms), "seeds": list(seeds),
            "overrides": overrides, "algorithm_defaults": defaults}
    return Plan(out, spec, items)


def run(p: Plan, say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train (or reuse, or resume) every sub-run of the plan, then write the table and the curves.
    Returns the table (as written to ``table.json``)."""
    from slea.trainer import checkpoint as ckpt

    say = say or (lambda msg: None)
    p.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(p.out / "compare.json", json.dumps(p.spec, indent=2))
    runs = []
    for i, (sub, cfg) in enumerate(p.items):
        label = f"[{i + 1}/{len(p.items)}] {sub.dir.name}"
        if (sub.dir / "eval" / "summary.json").is_file():
            sub.status = "reused"
            say(f"{label}: finished, reused")
        else:
            from slea.trainer.select import build_trainer

            resume = ckpt.latest_checkpoint(sub.dir / "checkpoints") is not None
            sub.status = "resumed" if resume else "trained"
            say(f"{label}: {'resuming' if resume else 'training'}")
            trainer = build_trainer(cfg, sub.dir)  # as `slea train`: the trainer the algorithm's needs pick
            try:
                trainer.fit(resume=resume)
            finally:
                trainer.close()
                rollouts = getattr(trainer, "rollouts", None)
                if rollouts is not None:  # runs share this process: release each one's envs
                    from slea.trainer.schemes import close

                    close(rollouts)
            del trainer
            gc.collect()
        runs.append(sub)
    table = summarize_runs(runs)
    table["spec"] = p.spec
    write_outputs(table, runs, p.out)
    return table


def compare(config: str | Path | None, algorithms: list[str], seeds: list[int], out: str | Path,
            overrides: list[str] | None = None, say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """:func:`plan` then :func:`run`: the whole comparison in one call."""
    return run(plan(config, algorithms, seeds, out, overrides), say=say)


# -- reading the sub-runs --------------------------------------------------------------------------------------
def env_step_curve(rows: list[dict[str, Any]]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Cumulative env steps after each logged iteration, and the per-iteration train metrics against them.

    Uses the ``env_steps`` counter the trainer logs; for runs without it, ``train/episode_len ×
    train/episodes`` accumulated."""
    if not rows:
        return np.zeros(0), {}
    if all("env_steps" in r for r in rows):
        x = np.array([float(r["env_steps"]) for r in rows])
    else:
        x = np.cumsum([float(r.get("train/episode_len", 0.0)) * float(r.get("train/episodes", 0.0)) for r in rows])
    ys = {k: np.array([float(r.get(k, math.nan)) for r in rows])
          for k in ("train/success", "train/return", "train/invalid_rate")}
    return x, ys


def stat(values: list[float]) -> dict[str, Any]:
    """Mean, std (ddof=1; 0 for one value), count and the values, over the finite ones."""
    v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return {"mean": None, "std": None, "n": 0, "values": []}
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0, "n": int(v.size),
            "values": [float(x) for x in v]}


def _load(sub: SubRun) -> dict[str, Any]:
    summary = json.loads((sub.dir / "eval" / "summary.json").read_text())
    rows = read_metrics(sub.dir / "metrics.jsonl")
    x, ys = env_step_curve(rows)
    after = summary.get("after") or {}
    return {"summary": summary, "x": x, "ys": ys,
            "heldout": (after.get("sampled") or {}).get("success"),
            "greedy": (after.get("greedy") or {}).get("success"),
            "before": ((summary.get("before") or {}).get("sampled") or {}).get("success"),
            "env_steps": float(x[-1]) if x.size else 0.0, "wall_s": summary.get("wall_s"),
            "rollouts": float(rows[-1].get("rollouts", rows[-1].get("episodes", math.nan))) if rows else 0.0,
            "iterations": len(rows)}


def _interp(x: np.ndarray, y: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Train success at env-step counts ``at``: linear between iterations; before the first logged iteration
    the first value (the curve is not extrapolated below it)."""
    ok = np.isfinite(y)
    if not ok.any():
        return np.full(len(at), math.nan)
    return np.interp(at, x[ok], y[ok])


def summarize_runs(runs: list[SubRun]) -> dict[str, Any]:
    """The comparison table (``table.json``): per algorithm, statistics over its seeds."""
    loaded = {(r.algorithm, r.seed): _load(r) for r in runs}
    ends = [d["env_steps"] for d in loaded.values() if d["env_steps"] > 0]
    horizon = min(ends) if ends else 0.0
    budgets = [round(f * horizon) for f in BUDGET_FRACTIONS] if horizon else []
    algos = list(dict.fromkeys(r.algorithm for r in runs))
    table: dict[str, Any] = {"budgets": budgets, "budget_fractions": list(BUDGET_FRACTIONS), "algorithms": {}}
    for algo in algos:
        mine = [(r, loaded[(r.algorithm, r.seed)]) for r in runs if r.algorithm == algo]
        at = {}
        for b in budgets:  # a run that never played b env steps (none at all: a team whose actor never moved)
            at[str(b)] = stat([float(_interp(d["x"], d["ys"]["train/success"], np.array([b]))[0])
                                if d["env_steps"] >= b else None for _, d in mine])
        table["algorithms"][algo] = {
            "seeds": [r.seed for r, _ in mine],
            "status": {str(r.seed): r.status for r, _ in mine},
            "heldout_success": stat([d["heldout"] for _, d in mine]),
            "heldout_greedy_success": stat([d["greedy"] for _, d in mine]),
            "heldout_success_before": stat([d["before"] for _, d in mine]),
            "train_success_at_env_steps": at,
            "final_train_success": stat([float(d["ys"]["train/success"][-1]) if d["x"].size else None
                                          for _, d in mine]),
            "env_steps": stat([d["env_steps"] for _, d in mine]),
            "rollouts": stat([d["rollouts"] for _, d in mine]),
            "iterations": stat([float(d["iterations"]) for _, d in mine]),
            "wall_s": stat([d["wall_s"] for _, d in mine]),
        }
    return table


# -- writing -------------------------------------------------------------------------------------------------
def _fmt(s: dict[str, Any], digits: int = 3) -> str:
    if s.get("mean") is None:
        return "–"
    if s["n"] > 1:
        return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"
    return f"{s['mean']:.{digits}f}"


def table_markdown(table: dict[str, Any]) -> str:
    budgets = table["budgets"]
    head = ["algorithm", "seeds", "held-out success", "greedy", "untrained"]
    head += [f"train succ. @ {b} steps" for b in budgets]
    head += ["env steps", "rollouts", "wall (min)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for algo, a in table["algorithms"].items():
        wall = a["wall_s"]
        wall_min = {**wall, "mean": wall["mean"] / 60, "std": (wall["std"] or 0) / 60} if wall["mean"] else wall
        cells = [algo, str(len(a["seeds"])), _fmt(a["heldout_success"]), _fmt(a["heldout_greedy_success"]),
                 _fmt(a["heldout_success_before"])]
        cells += [_fmt(a["train_success_at_env_steps"][str(b)]) for b in budgets]
        cells += [_fmt(a["env_steps"], 0), _fmt(a.get("rollouts", {}), 0), _fmt(wall_min, 1)]
        lines.append("| " + " | ".join(cells) + " |")
    spec = table.get("spec", {})
    notes = [
        "",
        f"Config `{spec.get('config')}`, seeds {spec.get('seeds')}, overrides {spec.get('overrides') or 'none'}"
        + (f", algorithm defaults {spec.get('algorithm_defaults')}" if spec.get("algorithm_defaults") else "")
        + ".",
        "Held-out success: sampled episodes on the held-out games after training (mean ± std over seeds, ddof=1).",
        ("Train success @ N steps: the per-iteration train success, linearly interpolated at N cumulative env "
         "steps (budgets = 25/50/75/100% of the shortest run's env steps; \"–\" for a run that played none), "
         "mean ± std over seeds."),
        ("Env steps and rollouts: totals per run (a rollout is a whole episode or, for rtpo, a sibling forked "
         "from a trunk's turn boundary; train.rollout_budget / train.env_step_budget stop runs at a matched "
         "budget)."),
    ]
    return "\n".join(lines + notes) + "\n"


def plot_compare(runs: list[SubRun], out: Path, points: int = 50) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    algos = list(dict.fromkeys(r.algorithm for r in runs))
    data = {(r.algorithm, r.seed): env_step_curve(read_metrics(r.dir / "metrics.jsonl")) for r in runs}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    panels = ((axes[0], "train/success", "train success", (0.0, 1.0)),
              (axes[1], "train/return", "mean return", (-math.inf, math.inf)))
    for ax, key, title, (lo_y, hi_y) in panels:
        for algo in algos:
            curves = [data[(r.algorithm, r.seed)] for r in runs if r.algorithm == algo]
            curves = [(x, ys[key]) for x, ys in curves if x.size]
            if not curves:
                continue
            lo = max(x[0] for x, _ in curves)
            hi = min(x[-1] for x, _ in curves)
            grid = np.linspace(lo, hi, points) if hi > lo else np.array([lo])
            ys = np.stack([_interp(x, y, grid) for x, y in curves])
            mean = np.nanmean(ys, axis=0)
            line = ax.plot(grid, mean, marker="o" if grid.size == 1 else None, label=f"{algo} (n={len(curves)})")
            if len(curves) > 1:
                half = 1.96 * np.nanstd(ys, axis=0, ddof=1) / math.sqrt(len(curves))
                ax.fill_between(grid, np.clip(mean - half, lo_y, hi_y), np.clip(mean + half, lo_y, hi_y), alpha=0.15,
                                color=line[0].get_color())
        ax.set_title(f"{title} (mean over seeds, 95% CI)")
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def write_outputs(table: dict[str, Any], runs: list[SubRun], out: Path) -> None:
    out = Path(out)
    atomic_write_text(out / "table.json", json.dumps(table, indent=2))
    atomic_write_text(out / "table.md", table_markdown(table))
    plot_compare(runs, out / "curves.png")


def relativize(folder: Path, anchors: tuple[str, ...] = ("bench/results/", "configs/")) -> int:
    """Rewrite the saved ``.json``/``.yaml``/``.md`` files under ``folder`` (checkpoints aside) so that absolute
    paths ending in one of ``anchors`` become repository-relative: results committed to the repository name no
    machine's folders. The count of files changed; resuming and reusing runs do not read those paths."""
    pattern = re.compile(r"/[^\s\"'`]*?/(" + "|".join(re.escape(a) for a in anchors) + ")")
    changed = 0
    for f in Path(folder).rglob("*"):
        if f.suffix in (".json", ".yaml", ".md") and f.is_file() and "checkpoints" not in f.parts:
            text = f.read_text()
            new = pattern.sub(r"\1", text)
            if new != text:
                f.write_text(new)
                changed += 1
    return changed
