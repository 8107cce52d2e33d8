"""``slea compare``: several algorithms (or variants of one config) × seeds, side by side, resumable.

Every sub-run ``<out>/runs/<label>-s<seed>/`` is an ordinary run folder trained from the same config with the
user's ``--set`` overrides, ``run.seed=<seed>`` and its arm's own settings (:class:`Arm`): ``algorithm.name=<algo>``
for ``--algorithms``, or a variant's settings for ``--variant LABEL:KEY=VALUE,...`` (such as TeamTR's
``team.rollouts=stale``, naive sequential training); then the config values the algorithm declares at
registration (``AlgorithmSpec.defaults``) where the config does not set them. A variant may not set what every
sub-run must share (``run.*``, ``eval.*``, ``env.eval_kwargs``: the seeds, the folders, the held-out games); a
``--set`` key that every arm sets is refused (it would be ignored). A setting only some of the compared algorithms read is accepted for the others (the refusal of
unused settings checks it against the whole comparison). So for a given seed every algorithm plays the same task groups in
every iteration (``rollout.sampling.iteration_seeds`` depends on the run seed and the iteration only), with the same number
of iterations, groups and copies, and is evaluated on the same held-out games. Env steps are counted, not
assumed equal (an episode may end early; dynamic sampling plays extra groups), and the table compares train
success at equal env-step budgets.

Every sub-run is trained by the trainer ``slea train`` would run for it (:func:`slea.trainer.select.
build_trainer`: the single-agent loop, or the TeamTR stage loop for an algorithm that needs a team, whose
metrics rows are single-agent updates carrying the same ``env_steps``/``rollouts``/``train/success`` columns).
A value a sub-run does not record is shown as "–". Sub-runs trained by different trainers (a team algorithm
beside a single-agent one) are refused at planning: a team's iteration is a stage of n + 1 collections, its episode
is ``team.max_turns`` messages and its prompts are the team's, so their rows and evaluations would not measure the
same thing. A single agent is compared with a team as a team variant (a one-agent team task).

Folder: ``--out``, else ``runs/compare-<config>-<hash>`` (:func:`default_out`: the hash covers the config file, the
arms, the seeds, the overrides and the baseline), so two different comparisons never share a folder.

Reuse: a sub-run with ``eval/summary.json`` is finished and is read, not recomputed; one with a checkpoint
resumes from it (``fit(resume=True)``); one stopped before its first checkpoint starts over in a cleared folder; a
sub-run whose saved config differs from the one this invocation would use is an error (use another ``--out``), so a
folder never mixes settings.

Outputs in ``<out>``: ``table.md`` and ``table.json`` (held-out success after training, mean ± std over
seeds; train success interpolated at common env-step budgets; env steps; rollouts, one per whole episode or
RTPO sibling continuation; wall time; and every arm against the baseline — the first arm, or ``--baseline`` —
paired by seed: the per-seed differences of held-out success, mean ± std, the exact sign-flip p over seeds with the
smallest p the seeds allow, a bootstrap 95% CI resampling seeds and then held-out games, and "separated" only at
p < 0.05, :mod:`slea.evaluation.stats`), ``curves.png`` (train
success and return against env steps: the mean over seeds with a 95% confidence band), ``compare.json`` (the
spec of the comparison).
"""

from __future__ import annotations

import gc
import hashlib
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
from slea.evaluation import stats
from slea.runs.folder import CHECKPOINTS, CURVES, RunFolder
from slea.runs.jsonfile import CompareSpec, CompareTable, Summary, read_json
from slea.runs.runlog import env_step_curve, read_metrics

__all__ = ["Arm", "Plan", "SubRun", "compare", "default_out", "finished_runs", "paired", "parse_variants", "plan",
           "rewrite_table", "run", "summarize_runs", "terminal_table", "train_sub_run", "write_outputs"]

BUDGET_FRACTIONS = (0.25, 0.5, 0.75, 1.0)


# what a variant may not set: the seeds and folders compare gives, and the held-out games every arm is scored on
SHARED_KEYS = ("run.", "eval.", "env.eval_kwargs")
LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


@dataclass
class SubRun:
    algorithm: str  # the arm's label: the algorithm's name, or the variant's
    seed: int
    dir: Path
    status: str = ""  # "reused", "resumed" or "trained"


@dataclass(frozen=True)
class Arm:
    """One row of the comparison: its label (the table's row; its sub-runs are ``<label>-s<seed>``) and the
    overrides that make it, applied after ``--set``: ``algorithm.name=<algo>`` for an algorithm, a variant's own
    settings for a variant."""

    label: str
    overrides: tuple[str, ...]


def run_name(algorithm: str, seed: int) -> str:
    return f"{algorithm}-s{seed}"


def _key(override: str) -> str:
    return override.partition("=")[0].strip()


def parse_variants(texts: list[str]) -> dict[str, list[str]]:
    """``--variant LABEL:KEY=VALUE[,KEY=VALUE...]`` (repeatable) as ``{label: overrides}``, in order. A comma
    separates two settings only where a ``key=`` follows it, so a list value (``[a,b]``) stays whole. A
    ``ValueError`` for a malformed or repeated variant."""
    out: dict[str, list[str]] = {}
    for text in texts:
        label, sep, rest = text.partition(":")
        label = label.strip()
        if not sep or not label or not rest.strip():
            raise ValueError(f"--variant {text!r}: expected LABEL:KEY=VALUE[,KEY=VALUE...]")
        if label in out:
            raise ValueError(f"--variant {label}: given twice")
        out[label] = [x.strip() for x in re.split(r",(?=\s*[A-Za-z_][\w.]*=)", rest) if x.strip()]
    return out


def make_arms(algorithms: list[str], variants: dict[str, list[str]] | None, overrides: list[str]) -> list[Arm]:
    """The comparison's arms: one per algorithm, or one per variant (not both: a variant may set
    ``algorithm.name``). A ``ValueError`` for none, a repeat, a label that cannot name a folder, a setting that is
    not ``KEY=VALUE``, one every sub-run must share (:data:`SHARED_KEYS`), or a ``--set`` key every arm sets (that
    value would be ignored; one only some arms set applies to the others)."""
    variants = dict(variants or {})
    if algorithms and variants:
        raise ValueError("give --algorithms or --variant, not both (a variant may set algorithm.name=...)")
    if not algorithms and not variants:
        raise ValueError("compare needs at least one algorithm or variant, and one seed")
    if len(set(algorithms)) != len(algorithms):
        raise ValueError("algorithms must not repeat")
    pairs = [(a, [f"algorithm.name={a}"]) for a in algorithms] or list(variants.items())
    kind = "algorithm" if algorithms else "variant"
    for key in dict.fromkeys(_key(o) for o in overrides):  # a --set every arm overrides would be ignored
        if all(key in {_key(o) for o in over} for _, over in pairs):
            raise ValueError(f"--set {key}: every {kind} of the comparison sets it, so this value would be ignored")
    for label, over in pairs:
        if not LABEL.fullmatch(label):
            raise ValueError(f"{kind} {label!r}: a label is letters, digits and _ . + - (it names folders)")
        if not over:
            raise ValueError(f"variant {label}: no setting (expected LABEL:KEY=VALUE[,KEY=VALUE...])")
        for o in over:
            if "=" not in o:
                raise ValueError(f"variant {label}: {o!r} is not KEY=VALUE")
            if kind == "variant" and _key(o).startswith(SHARED_KEYS):
                raise ValueError(f"variant {label}: {_key(o)} is the same for every sub-run (the seeds, folders and "
                                 f"held-out games of a fair comparison); set it with --set")
    return [Arm(label, tuple(over)) for label, over in pairs]


def default_out(config: str | Path | None, arms: list[Arm], seeds: list[int], overrides: list[str],
                baseline: str | None = None) -> Path:
    """The folder of a comparison given no ``--out``: ``runs/compare-<config>-<hash>``, the hash (8 hex digits of
    a SHA-256) over the config file's bytes, the arms in order with their settings, the seeds, the ``--set``
    overrides and the baseline. The same comparison always finds its folder again (finished sub-runs are reused);
    two different ones never share a folder, where the second would overwrite the first's table."""
    key = {"config": hashlib.sha256(Path(config).read_bytes()).hexdigest() if config else None,
           "arms": [[a.label, *a.overrides] for a in arms], "seeds": list(seeds), "overrides": list(overrides),
           "baseline": baseline}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:8]
    return Path("runs") / f"compare-{Path(config).stem if config else 'default'}-{digest}"


def sub_config(config: str | Path | None, arm: Arm, seed: int, overrides: list[str], run_dir: Path) -> RunConfig:
    """A sub-run's config: the shared config, ``--set``, the seed, the arm's settings, its folder and name."""
    over = [*overrides, f"run.seed={seed}", *arm.overrides, f"run.dir={run_dir}",
            f"run.name={run_name(arm.label, seed)}"]
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


def _check_one_trainer(items: list[tuple[SubRun, RunConfig]]) -> None:
    """A ``ValueError`` when the sub-runs are not all trained by one trainer (module docstring: what a team's
    rows and evaluations measure differs from a single agent's)."""
    from slea.trainer.select import trainer_kind

    first: dict[str, str] = {}
    for sub, cfg in items:
        first.setdefault(trainer_kind(get_algorithm(cfg.algorithm.name)).name, sub.algorithm)
    if len(first) > 1:
        (k1, a1), (k2, a2) = list(first.items())[:2]
        raise ValueError(f"{a1} is trained by the {k1} trainer and {a2} by the {k2} trainer, whose iterations, "
                         f"episodes and prompts differ: one table would not compare them fairly (compare a single "
                         f"agent with a team as a team variant, a one-agent team task)")


def plan(config: str | Path | None, algorithms: list[str], seeds: list[int], out: str | Path | None,
         overrides: list[str] | None = None, variants: dict[str, list[str]] | None = None,
         baseline: str | None = None) -> Plan:
    """Resolve and validate every sub-run's config before anything trains (a typo fails fast, not after
    hours): one arm per algorithm, or per variant (``{label: overrides}``, :func:`make_arms`); ``baseline`` is
    the arm every other is compared with, paired by seed (default the first); ``out`` None: the comparison's own
    folder (:func:`default_out`). Raises ``ConfigError`` for a bad config and ``ValueError`` for a bad spec, a
    baseline that is no arm, a mix of trainers, or an ``out`` folder holding a sub-run trained with different
    settings."""
    overrides = list(overrides or [])
    arms = make_arms(list(algorithms), variants, overrides)
    out = Path(out) if out is not None else default_out(config, arms, seeds, overrides, baseline)
    if baseline is not None and baseline not in [a.label for a in arms]:
        raise ValueError(f"--baseline {baseline}: not one of the compared arms ({', '.join(a.label for a in arms)})")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError("compare needs at least one seed, and seeds must not repeat")
    items = []
    for arm in arms:
        for seed in seeds:
            d = out / "runs" / run_name(arm.label, seed)
            cfg = sub_config(config, arm, seed, overrides, d)
            if RunFolder(d).is_run():
                same, why = same_config(RunFolder(d).config, cfg)
                if not same:
                    raise ValueError(f"{d} was trained with another config ({why}); use another --out")
            items.append((SubRun(arm.label, seed, d), cfg))
    _check_unused([cfg for _, cfg in items])
    from slea.trainer.select import check_config

    for _, cfg in items:  # the chosen trainer's own checks (a team trainer's), before any sub-run trains
        check_config(cfg)
    _check_one_trainer(items)
    names = dict.fromkeys(cfg.algorithm.name for _, cfg in items)
    defaults = {a: dict(get_algorithm(a).defaults) for a in names if get_algorithm(a).defaults}
    spec = {"config": str(config) if config else None, "algorithms": [a.label for a in arms], "seeds": list(seeds),
            "overrides": overrides, "algorithm_defaults": defaults}
    if variants:
        spec["variants"] = {a.label: list(a.overrides) for a in arms}
    if baseline is not None:
        spec["baseline"] = baseline
    return Plan(out, spec, items)


def run(p: Plan, say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train (or reuse, or resume) every sub-run of the plan, then write the table and the curves.
    Returns the table (as written to ``table.json``)."""
    say = say or (lambda msg: None)
    p.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(p.out / "compare.json", json.dumps(p.spec, indent=2))
    runs = []
    for i, (sub, cfg) in enumerate(p.items):
        train_sub_run(sub, cfg, say, f"[{i + 1}/{len(p.items)}] {sub.dir.name}")
        runs.append(sub)
    table = summarize_runs(runs, baseline=p.spec.get("baseline"))
    table["spec"] = p.spec
    write_outputs(table, runs, p.out)
    return table


def train_sub_run(sub: SubRun, cfg: RunConfig, say: Callable[[str], None] | None = None, label: str | None = None
                  ) -> str:
    """One sub-run of a plan: reused when finished (``eval/summary.json``), resumed from its newest checkpoint, or
    trained, by the trainer ``slea train`` would pick (:func:`slea.trainer.select.build_trainer`). Sets and returns
    ``sub.status`` (``"reused"``, ``"resumed"`` or ``"trained"``); ``say`` gets one line saying which."""
    from slea.runs import checkpoint as ckpt

    say = say or (lambda msg: None)
    label = label or str(sub.dir)
    if RunFolder(sub.dir).summary.is_file():
        sub.status = "reused"
        say(f"{label}: finished, reused")
        return sub.status
    from slea.trainer.lifecycle import fresh_run_dir
    from slea.trainer.select import build_trainer

    resume = ckpt.latest_checkpoint(RunFolder(sub.dir).checkpoints) is not None
    sub.status = "resumed" if resume else "trained"
    if not resume and sub.dir.is_dir() and any(sub.dir.iterdir()):  # stopped before its first checkpoint
        say(f"{label}: no usable checkpoint; starting it over")
        fresh_run_dir(sub.dir, overwrite=True)  # its rows and events would otherwise mix with the new run's
    say(f"{label}: {'resuming' if resume else 'training'}")
    trainer = build_trainer(cfg, sub.dir)  # as `slea train`: the trainer the algorithm's needs pick
    try:
        trainer.fit(resume=resume)
    finally:
        trainer.close()
        rollouts = getattr(trainer, "rollouts", None)
        if rollouts is not None:  # runs share this process: release each one's envs
            from slea.rollout.schemes import close

            close(rollouts)
    del trainer
    gc.collect()
    return sub.status


def compare(config: str | Path | None, algorithms: list[str], seeds: list[int], out: str | Path | None,
            overrides: list[str] | None = None, say: Callable[[str], None] | None = None,
            variants: dict[str, list[str]] | None = None, baseline: str | None = None) -> dict[str, Any]:
    """:func:`plan` then :func:`run`: the whole comparison in one call."""
    return run(plan(config, algorithms, seeds, out, overrides, variants, baseline), say=say)


# -- reading the sub-runs --------------------------------------------------------------------------------------
def stat(values: list[float]) -> dict[str, Any]:
    """Mean, std (ddof=1; 0 for one value), count and the values, over the finite ones."""
    v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return {"mean": None, "std": None, "n": 0, "values": []}
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0, "n": int(v.size),
            "values": [float(x) for x in v]}


def _load(sub: SubRun) -> dict[str, Any]:
    summary = read_json(RunFolder(sub.dir).summary, Summary)
    rows = read_metrics(RunFolder(sub.dir).metrics)
    x, ys = env_step_curve(rows)
    after = summary.get("after") or {}
    return {"summary": summary, "x": x, "ys": ys,
            "heldout": (after.get("sampled") or {}).get("success"),
            "heldout_games": stats.per_game_success(after),
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


def paired(runs: list[SubRun], a: str, b: str, loaded: dict[tuple[str, int], dict[str, Any]] | None = None
           ) -> stats.PairedComparison:
    """Arm ``a`` against arm ``b`` on held-out sampled success, paired by seed (:func:`slea.evaluation.stats.
    paired_comparison`): the bootstrap resamples seeds and then held-out games (each run's ``per_game_wins``) where
    both arms' evaluations hold the same games, else seeds only."""
    loaded = loaded if loaded is not None else {(r.algorithm, r.seed): _load(r) for r in runs}
    by = {arm: {s: d for (x, s), d in loaded.items() if x == arm} for arm in (a, b)}
    return stats.paired_comparison({s: d["heldout"] for s, d in by[a].items()},
                                   {s: d["heldout"] for s, d in by[b].items()},
                                   a_games={s: d["heldout_games"] for s, d in by[a].items()},
                                   b_games={s: d["heldout_games"] for s, d in by[b].items()},
                                   names=(a, b), metric="held-out success")


def summarize_runs(runs: list[SubRun], baseline: str | None = None) -> dict[str, Any]:
    """The comparison table (``table.json``): per algorithm, statistics over its seeds; and under ``pairs`` every
    other arm against ``baseline`` (default the first arm), paired by seed (:func:`paired`). A ``ValueError`` for a
    baseline with no run."""
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
    if algos:
        base = baseline if baseline is not None else algos[0]
        if base not in algos:
            raise ValueError(f"baseline {base}: no finished run of it (arms: {', '.join(algos)})")
        table["baseline"] = base
        table["pairs"] = [paired(runs, a, base, loaded).to_dict() for a in algos if a != base]
    return table


def parse_run_name(name: str) -> tuple[str, int] | None:
    """``<arm>-s<seed>`` as (arm, seed); None for a folder name of another form."""
    arm, sep, seed = name.rpartition("-s")
    return (arm, int(seed)) if sep and arm and seed.isdigit() else None


def finished_runs(folder: str | Path, order: list[str] | tuple[str, ...] | None = None) -> list[SubRun]:
    """The finished sub-runs (``eval/summary.json``) under ``<folder>/runs/<arm>-s<seed>/``, read from the folder
    names, not from a fixed list of arms: the arms named in ``order`` first, in that order, then the others
    alphabetically; seeds in order."""
    found = []
    runs = Path(folder) / "runs"
    for d in sorted(runs.iterdir()) if runs.is_dir() else []:
        parsed = parse_run_name(d.name)
        if parsed and RunFolder(d).summary.is_file():
            found.append(SubRun(parsed[0], parsed[1], d, "reused"))
    rank = {a: i for i, a in enumerate(order or [])}
    return sorted(found, key=lambda r: (rank.get(r.algorithm, len(rank)), r.algorithm, r.seed))


def rewrite_table(out: str | Path, baseline: str | None = None) -> dict[str, Any]:
    """``table.md`` and ``table.json`` of a comparison folder again from its finished sub-runs (nothing trains,
    ``curves.png`` stays): the spec from ``compare.json`` (else the old ``table.json``), the baseline ``baseline``,
    else the spec's, else the first arm. Returns the table. A ``ValueError`` when no sub-run has finished."""
    out = Path(out)
    spec: dict[str, Any] = {}
    if (out / "compare.json").is_file():
        spec = read_json(out / "compare.json", CompareSpec)
    elif (out / "table.json").is_file():
        spec = read_json(out / "table.json", CompareTable).get("spec") or {}
    runs = finished_runs(out, spec.get("algorithms"))
    if not runs:
        raise ValueError(f"{out}: no finished sub-run under runs/<arm>-s<seed>/")
    table = summarize_runs(runs, baseline=baseline or spec.get("baseline"))
    table["spec"] = spec
    atomic_write_text(out / "table.json", json.dumps(table, indent=2))
    atomic_write_text(out / "table.md", table_markdown(table))
    return table


# -- writing -------------------------------------------------------------------------------------------------
def _fmt(s: dict[str, Any], digits: int = 3) -> str:
    if s.get("mean") is None:
        return "–"
    if s["n"] > 1:
        return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"
    return f"{s['mean']:.{digits}f}"


def _minutes(wall: dict[str, Any]) -> dict[str, Any]:
    """A ``stat`` of wall seconds in minutes."""
    return {**wall, "mean": wall["mean"] / 60, "std": (wall["std"] or 0) / 60} if wall["mean"] else wall


def table_markdown(table: dict[str, Any]) -> str:
    budgets = table["budgets"]
    spec = table.get("spec", {})
    head = ["variant" if spec.get("variants") else "algorithm", "seeds", "held-out success", "greedy", "untrained"]
    head += [f"train succ. @ {b} steps" for b in budgets]
    head += ["env steps", "rollouts", "wall (min)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for algo, a in table["algorithms"].items():
        cells = [algo, str(len(a["seeds"])), _fmt(a["heldout_success"]), _fmt(a["heldout_greedy_success"]),
                 _fmt(a["heldout_success_before"])]
        cells += [_fmt(a["train_success_at_env_steps"][str(b)]) for b in budgets]
        cells += [_fmt(a["env_steps"], 0), _fmt(a.get("rollouts", {}), 0), _fmt(_minutes(a["wall_s"]), 1)]
        lines.append("| " + " | ".join(cells) + " |")
    variants = spec.get("variants") or {}
    notes = [
        "",
        f"Config `{spec.get('config')}`, seeds {spec.get('seeds')}, overrides {spec.get('overrides') or 'none'}"
        + (f", algorithm defaults {spec.get('algorithm_defaults')}" if spec.get("algorithm_defaults") else "")
        + (("; variants: " + "; ".join(f"{v}: {', '.join(o)}" for v, o in variants.items())) if variants else "")
        + ".",
        "Held-out success: sampled episodes on the held-out games after training (mean ± std over seeds, ddof=1).",
        ("Train success @ N steps: the per-iteration train success, linearly interpolated at N cumulative env "
         "steps (budgets = 25/50/75/100% of the shortest run's env steps; \"–\" for a run that played none), "
         "mean ± std over seeds."),
        ("Env steps and rollouts: totals per run (a rollout is a whole episode or, for rtpo, a sibling forked "
         "from a trunk's turn boundary; train.rollout_budget / train.env_step_budget stop runs at a matched "
         "budget)."),
    ]
    pairs = table.get("pairs") or []
    if pairs:
        notes += ["", f"Held-out success against {table['baseline']}, paired by seed:", "",
                  stats.markdown_table(pairs).rstrip()]
    return "\n".join(lines + notes) + "\n"


TERMINAL_WIDTH = 80


def _fit(parts: list[str], width: int, indent: str = "    ") -> list[str]:
    """``parts`` joined by two spaces into lines of at most ``width`` columns, later lines indented."""
    lines = [parts[0]]
    for part in parts[1:]:
        if len(lines[-1]) + 2 + len(part) <= width:
            lines[-1] += "  " + part
        else:
            lines.append(indent + part)
    return lines


def terminal_table(table: dict[str, Any], width: int = TERMINAL_WIDTH) -> str:
    """The comparison as a terminal shows it, every line within ``width`` columns: per arm its seeds, held-out
    success (mean ± std over seeds), env steps and wall minutes; then every arm against the baseline, paired by seed
    (the mean ± std of the differences, n, the exact sign-flip p, the 95% bootstrap CI, the verdict). The other
    columns (greedy, untrained, train success at equal env-step budgets, rollouts, per-seed differences, the
    smallest possible p) are in ``table.md``."""
    cols = (("seeds", 5), ("held-out success", 16), ("env steps", 11), ("wall (min)", 10))
    kind = "variant" if (table.get("spec") or {}).get("variants") else "algorithm"
    label_w = min(max(len(kind), *(len(a) for a in table["algorithms"])), width - sum(w + 2 for _, w in cols))

    def cell(text: str, w: int) -> str:
        return text if len(text) <= w else text[:w - 1] + "…"

    lines = [cell(kind, label_w).ljust(label_w) + "".join("  " + name.rjust(w) for name, w in cols)]
    for algo, a in table["algorithms"].items():
        values = [str(len(a["seeds"])), _fmt(a["heldout_success"]), _fmt(a["env_steps"], 0),
                  _fmt(_minutes(a["wall_s"]), 1)]
        lines.append(cell(algo, label_w).ljust(label_w) + "".join(f"  {cell(v, w).rjust(w)}"
                                                                   for v, (_, w) in zip(values, cols)))
    pairs = table.get("pairs") or []
    if pairs:
        lines += ["", f"against {table['baseline']}, held-out success paired by seed:"]
        for c in pairs:
            p = stats.format_p(c["p"]) + ("" if c["p_exact"] or c["p"] is None else " (sampled)")
            lines += _fit([f"  {c['a']} − {c['b']}: {stats.format_mean_std(c)}", f"n={c['n']}", f"p={p}",
                           f"95% CI {stats.format_ci(c['ci'], 2)}", c["verdict"]], width)
    return "\n".join(line[:width] for line in lines) + "\n"


def plot_compare(runs: list[SubRun], out: Path, points: int = 50) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    algos = list(dict.fromkeys(r.algorithm for r in runs))
    data = {(r.algorithm, r.seed): env_step_curve(read_metrics(RunFolder(r.dir).metrics)) for r in runs}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    panels = ((axes[0], "train/success", "train success", (0.0, 1.0)),
              (axes[1], "train/return", "mean return", (-math.inf, math.inf)))
    for ax, key, title, (lo_y, hi_y) in panels:
        for algo in algos:
            curves = [data[(r.algorithm, r.seed)] for r in runs if r.algorithm == algo]
            curves = [(x, ys[key]) for x, ys in curves if x.size and np.isfinite(x).all()]
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
    if axes[0].get_legend_handles_labels()[0]:  # runs that recorded no env steps draw no curve
        axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def write_outputs(table: dict[str, Any], runs: list[SubRun], out: Path) -> None:
    out = Path(out)
    atomic_write_text(out / "table.json", json.dumps(table, indent=2))
    atomic_write_text(out / "table.md", table_markdown(table))
    plot_compare(runs, out / CURVES)


def relativize(folder: Path,
               anchors: tuple[str, ...] = ("bench/results/", "experiments/results/", "configs/")) -> int:
    """Rewrite the saved ``.json``/``.yaml``/``.md`` files under ``folder`` (checkpoints aside) so that absolute
    paths ending in one of ``anchors`` become repository-relative: results committed to the repository name no
    machine's folders. The count of files changed; resuming and reusing runs do not read those paths."""
    pattern = re.compile(r"/[^\s\"'`]*?/(" + "|".join(re.escape(a) for a in anchors) + ")")
    changed = 0
    for f in Path(folder).rglob("*"):
        if f.suffix in (".json", ".yaml", ".md") and f.is_file() and CHECKPOINTS not in f.parts:
            text = f.read_text()
            new = pattern.sub(r"\1", text)
            if new != text:
                f.write_text(new)
                changed += 1
    return changed
