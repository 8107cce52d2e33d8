"""The SLEA-RL positive control on ``slea/Recall-v0`` (configs/control_recall.yaml): three studies, one run per call.

``agent`` — (a) the mechanism without training. The frozen embedded model plays training games with ``slea agent
--evolve --split train``: the library learns from those episodes (rule extractor, the control config's settings).
Then ``slea agent`` plays the held-out games (32 x 2 sampled episodes, and one greedy each) without and with that
library, paired episode by episode. Seed ``s`` builds its library from training games ``1000(s+1) ...``; every
seed is scored on the same held-out games as the training runs (env seeds 0..31). Output:
``experiments/results/control_recall/agent/s<seed>/{build,heldout}/agent.json`` and the built ``library.sqlite``.

``run`` — (b) one ``slea compare`` sub-run of ``configs/control_recall.yaml`` (``--arm`` one of :data:`ARMS`: slea,
slea_task, slea_off, grpo, gigpo): the same task groups per iteration for a given seed, the same budget, the same 64
held-out episodes, under ``experiments/results/control_recall/<study>/runs/<arm>-s<seed>/`` (``--study``, default
``compare``); then, for ``slea``, (c) the same policy evaluated
with retrieval switched off (``slea eval RUN --set experience.mode=off`` → ``eval_library_off/eval/``, as
experiments/slea_evidence.py does; it needs the run's checkpoint, so it follows the training in the same session).

``table`` — the study's table.md/json and curves.png for (b) and (c) (``--study``, default ``compare``; the arms are
read from its run folders' names), each comparison paired by seed with its exact sign-flip p and bootstrap CI; and
agent.md for (a).

``power`` — the size of the confirmatory study (``powered``), before its runs: the 8-seed study at today's settings
(``eight_seeds``) is the pilot; :func:`slea.evaluation.power.seeds_for_power` finds the fewest fresh seeds that give
80 % power for slea − grpo (exact sign-flip, α = 0.05) when each fresh seed's difference is a pilot seed's,
drawn again, and grpo also scores on a seed as often, and as much, as it did on the 16 seeds of both 8-seed studies.
Output: ``powered/power.json`` and ``powered/power.md``.

``trace`` — a slea run's held-out step trace (``slea agent --trace`` with the run's final policy and library, with
and without the library) and its diagnosis, under ``<study>/runs/slea-s<seed>/trace/``: which lessons each step
saw and whether the answer followed them (the powered study's secondary analyses).

``diagnose`` — why (a) wins so little: ``slea agent --trace`` plays the held-out games of ``agent`` again with
seed ``s``'s built library (the same settings), then :func:`diagnosis` counts per chamber type, condition and
decoding mode what was retrieved (a positive lesson naming the right gesture, only the right gesture) and whether
the answer copied it. Output: ``agent/s<seed>/trace/{agent.json,steps.jsonl,diagnosis.json,diagnosis.md}``.

    python experiments/control_recall.py agent --seed 0
    python experiments/control_recall.py run --algo slea --seed 0
    python experiments/control_recall.py table
    python experiments/control_recall.py diagnose --seed 0

``--set KEY=VALUE`` (repeatable) overrides the config; ``$SLEA_CONTROL_RECALL_DIR`` puts the results elsewhere.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from slea import compare
from slea.evaluation import power as study_power
from slea.evaluation import stats

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(os.environ.get("SLEA_CONTROL_RECALL_DIR") or ROOT / "experiments" / "results" / "control_recall")
CONFIG = ROOT / "configs" / "control_recall.yaml"
# the arms a run can be: label -> the settings that make it (the label names its folders, <arm>-s<seed>)
ARMS = {
    "slea": ["algorithm.name=slea"],  # step-level retrieval (slea's own default, experience.mode: step)
    "slea_task": ["algorithm.name=slea", "experience.mode=task"],  # retrieved once per episode, by the task
    "slea_off": ["algorithm.name=slea", "experience.mode=off"],  # slea's credit assignment, no library
    "grpo": ["algorithm.name=grpo"],
    "gigpo": ["algorithm.name=gigpo"],
}
# (a): library built from 16 training games x 8 sampled episodes (+ 1 greedy each), evolving every 4 games
BUILD = {"games": 16, "episodes": 8, "batch": 4}
HELDOUT = {"games": 32, "episodes": 2, "seed": 0}


def _cli(*args: str) -> None:
    cmd = [sys.executable, "-m", "slea.cli", *args]
    print("$ slea " + " ".join(args[:1] + tuple(a if " " not in a else repr(a) for a in args[1:])), flush=True)
    subprocess.run(cmd, check=True)


def _flat(d: dict[str, Any], prefix: str) -> list[str]:
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out += _flat(v, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}={json.dumps(v) if isinstance(v, (list, bool)) or v is None else v}")
    return out


def agent_settings(extra: list[str] | None = None) -> list[str]:
    """``--set`` overrides that make ``slea agent`` play as the control config's runs do (env, rollout, the
    experience settings, the model's precision): ``slea agent`` with ``--model embedded`` starts from the default
    config."""
    import yaml

    raw = yaml.safe_load(CONFIG.read_text())
    # the warm-up and the minimum size stay slea agent's 0: the library is given (or being built) from the start
    exp = {k: v for k, v in raw["experience"].items() if k not in ("warmup_iters", "min_entries")}
    keep = {"env": {k: v for k, v in raw["env"].items() if k != "id"}, "rollout": raw["rollout"],
            "experience": exp, "model": {"dtype": raw["model"]["dtype"]}}
    sets = [*_flat(keep, ""), "experience.mode=step", "eval.temperature=1.0"]
    return [x for s in [*sets, *(extra or [])] for x in ("--set", s)]


def agent(seed: int, extra: list[str] | None = None) -> None:
    """(a) for one seed (module docstring); each step is skipped when its agent.json exists."""
    from slea.config import load_config
    from slea.experience.manager import ExperienceManager

    base = RESULTS / "agent" / f"s{seed}"
    build, held = base / "build", base / "heldout"
    sets = agent_settings(extra)
    if not (build / "agent.json").is_file():
        build.mkdir(parents=True, exist_ok=True)
        empty = base / "empty.sqlite"
        empty.unlink(missing_ok=True)
        ExperienceManager(load_config(CONFIG, check_unused=False).experience, empty).close()
        _cli("agent", "--model", "embedded", "--library", str(empty), "--env", "slea/Recall-v0", "--evolve",
             "--split", "train", "--games", str(BUILD["games"]), "--episodes", str(BUILD["episodes"]),
             "--batch", str(BUILD["batch"]), "--seed", str(1000 * (seed + 1)), "--out", str(build), *sets)
        empty.unlink(missing_ok=True)
    if not (held / "agent.json").is_file():
        _cli(*heldout_args(build / "library.sqlite", held, extra))
    compare.relativize(RESULTS)


def heldout_args(library: Path, out: Path, extra: list[str] | None = None, model: str = "embedded") -> list[str]:
    """``slea agent`` arguments of (a)'s held-out comparison with ``library``, written to ``out`` (``model``: the
    frozen embedded model, or a run folder's trained policy)."""
    return ["agent", "--model", model, "--library", str(library), "--env", "slea/Recall-v0",
            "--games", str(HELDOUT["games"]), "--episodes", str(HELDOUT["episodes"]), "--seed", str(HELDOUT["seed"]),
            "--out", str(out), *agent_settings(extra)]


# -- diagnose: what was retrieved, and was it copied ----------------------------------------------------------
def chamber_of(anchor: str) -> str:
    """The chamber type whose description the observation is (its fixed text before the warden's name), else
    ``other``."""
    from slea.envs.recall import CHAMBERS

    for kind, desc in CHAMBERS:
        if anchor.startswith(desc.split("{name}")[0]):
            return kind
    return "other"


def named_gestures(text: str | None) -> list[str]:
    """The gestures a lesson names: its quoted commands' first words that are gestures, in order, once each
    (``'kneel' → 'whistle'`` → kneel, whistle; ``'whistle …'`` → whistle)."""
    from slea.envs.recall import GESTURES
    from slea.experience.library import quoted_commands

    out: list[str] = []
    for q in quoted_commands(text or ""):
        w = q.split()[0] if q.split() else ""
        if w in GESTURES and w not in out:
            out.append(w)
    return out


@functools.cache
def _game(split: str, seed: int, chambers: int) -> tuple:
    """Recall's game ``seed`` (generated once per diagnosis, not once per step)."""
    from slea.envs.recall import generate_game

    return tuple(generate_game(split, seed, chambers))


def listed_first(row: dict[str, Any], split: str = "heldout", chambers: int = 3) -> str | None:
    """The first gesture of the valid list the row's chamber showed (the game's own shuffled order)."""
    if row.get("seed") is None:
        return None
    for room in _game(split, int(row["seed"]), chambers):
        if room.text == row["anchor"]:
            return room.order[0]
    return None


COUNTS = ("steps", "retrieved", "named_right", "only_right", "copies_top", "copies_any", "right", "first_listed",
          "named_right_and_right", "not_named_right_and_right")


def diagnosis(rows: list[dict[str, Any]], split: str = "heldout", chambers: int = 3) -> dict[str, Any]:
    """Per (condition, mode, chamber type), and over all types (``all``), over ``slea agent --trace`` rows:

    ``steps``; ``retrieved``: steps with any experience; ``named_right``: steps whose retrieved positive lessons
    name the chamber's right gesture (a quoted gesture); ``only_right``: they name it and no other gesture;
    ``copies_top`` / ``copies_any``: the answer is a gesture named by the first retrieved lesson (the prompt's
    first, the best strategy) / by any retrieved lesson; ``right``: the answer is the right gesture;
    ``first_listed``: the answer is the first gesture of the valid list shown; ``named_right_and_right`` /
    ``not_named_right_and_right``: right answers among the steps where the right gesture was named / was not;
    ``actions``: the answers (a gesture, or ``invalid``). Also, per chamber type, the distinct sets of retrieved
    lessons with the steps that saw each (``retrieved_sets``)."""
    from slea.envs.recall import RIGHT

    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    sets: dict[str, dict[tuple, dict[str, Any]]] = {}
    for r in rows:
        kind = chamber_of(r["anchor"])
        right = RIGHT.get(kind)
        exps = r.get("experiences") or []
        pos = [g for e in exps if e.get("zone") == "pos" for g in named_gestures(e.get("text"))]
        top = named_gestures(exps[0].get("text")) if exps else []
        anyg = {g for e in exps for g in named_gestures(e.get("text"))}
        act = r["action"] if r.get("valid") and r.get("action") else "invalid"
        named = right is not None and right in pos
        flags = {"steps": True, "retrieved": bool(exps), "named_right": named,
                 "only_right": named and set(pos) == {right}, "copies_top": act in top, "copies_any": act in anyg,
                 "right": act == right, "first_listed": act == listed_first(r, split, chambers),
                 "named_right_and_right": named and act == right,
                 "not_named_right_and_right": not named and act == right}
        for k in (kind, "all"):
            g = groups.setdefault((r["condition"], r["mode"], k),
                                  {**dict.fromkeys(COUNTS, 0), "actions": {}})
            for name, on in flags.items():
                g[name] += int(on)
            g["actions"][act] = g["actions"].get(act, 0) + 1
        if exps and r["condition"] == "with":
            key = tuple((e.get("zone"), e.get("text")) for e in exps)
            s = sets.setdefault(kind, {}).setdefault(key, {"lessons": [f"{z}: {t}" for z, t in key], "steps": 0})
            s["steps"] += 1
    table = [{"condition": c, "mode": m, "chamber": k, **v} for (c, m, k), v in groups.items()]
    order = {"without": 0, "with": 1}
    kinds = [*RIGHT, "other", "all"]
    table.sort(key=lambda x: (order.get(x["condition"], 2), x["mode"], kinds.index(x["chamber"])))
    return {"right": dict(RIGHT), "table": table,
            "retrieved_sets": {k: sorted(v.values(), key=lambda x: -x["steps"]) for k, v in sets.items()}}


def _pct(a: int, b: int) -> str:
    return f"{a}/{b}" + (f" ({a / b:.0%})" if b else "")


def diagnosis_markdown(d: dict[str, Any]) -> str:
    head = ("| condition | mode | chamber (right) | steps | retrieved | names right | names only right | copies top "
            "lesson | copies any lesson | right | right when named | right when not named | first listed | answers |")
    lines = [head, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for x in d["table"]:
        n, named = x["steps"], x["named_right"]
        acts = ", ".join(f"{a} {c}" for a, c in sorted(x["actions"].items(), key=lambda kv: -kv[1]))
        lines.append(f"| {x['condition']} | {x['mode']} | {x['chamber']} ({d['right'].get(x['chamber'], '–')}) | "
                     f"{n} | {x['retrieved']} | {x['named_right']} | {x['only_right']} | {x['copies_top']} | "
                     f"{x['copies_any']} | {_pct(x['right'], n)} | {_pct(x['named_right_and_right'], named)} | "
                     f"{_pct(x['not_named_right_and_right'], n - named)} | {x['first_listed']} | {acts} |")
    lines += ["", "Retrieved lessons (with the library), per chamber type: the distinct sets in prompt order.", ""]
    for kind, sets in d["retrieved_sets"].items():
        lines.append(f"- **{kind}** (right: {d['right'].get(kind, '–')})")
        for s in sets:
            lines.append(f"  - {s['steps']} steps: " + " / ".join(s["lessons"]))
    return "\n".join(lines) + "\n"


def diagnose(seed: int, extra: list[str] | None = None) -> Path:
    """``slea agent --trace`` on (a)'s held-out games with seed ``seed``'s built library (skipped when its
    steps.jsonl exists), then diagnosis.json and diagnosis.md next to it."""
    base = RESULTS / "agent" / f"s{seed}"
    lib, out = base / "build" / "library.sqlite", base / "trace"
    if not lib.is_file():
        raise SystemExit(f"diagnose: {lib} does not exist: run `agent --seed {seed}` first")
    steps = out / "steps.jsonl"
    if not steps.is_file():
        _cli(*heldout_args(lib, out, extra), "--trace")
    rows = [json.loads(x) for x in steps.read_text().splitlines() if x.strip()]
    d = diagnosis(rows)
    (out / "diagnosis.json").write_text(json.dumps(d, indent=2))
    md = diagnosis_markdown(d)
    (out / "diagnosis.md").write_text(md)
    print(md)
    compare.relativize(RESULTS)
    return out


def trace(seed: int, study: str, extra: list[str] | None = None) -> Path:
    """The held-out step trace of study ``study``'s slea run of seed ``seed`` (its final policy and library, with
    and without the library: ``slea agent --model RUN --library RUN --trace``), then its diagnosis, under
    ``RUN/trace/``. It needs the run's checkpoint, so it follows the training in the same session; skipped when its
    steps.jsonl exists."""
    d = run_dir("slea", seed, study)
    out, steps = d / "trace", d / "trace" / "steps.jsonl"
    if not steps.is_file():
        _cli(*heldout_args(d, out, extra, model=str(d)), "--trace")
    rows = [json.loads(x) for x in steps.read_text().splitlines() if x.strip()]
    diag = diagnosis(rows)
    (out / "diagnosis.json").write_text(json.dumps(diag, indent=2))
    (out / "diagnosis.md").write_text(diagnosis_markdown(diag))
    compare.relativize(RESULTS)
    return out


def run_dir(arm: str, seed: int, study: str = "compare") -> Path:
    return RESULTS / study / "runs" / compare.run_name(arm, seed)


def run(arm: str, seed: int, extra: list[str] | None = None, study: str = "compare") -> None:
    """(b) one sub-run of arm ``arm`` (:data:`ARMS`) under ``RESULTS/<study>/runs/<arm>-s<seed>/``, then (c) for
    ``slea``. A finished run is reused and an interrupted one resumed (slea compare)."""
    plan = compare.plan(CONFIG, [], [seed], RESULTS / study, list(extra or []), variants={arm: ARMS[arm]})
    compare.run(plan, say=print)
    if arm == "slea":
        library_off(seed, study)
    compare.relativize(RESULTS)


def library_off_eval(d: Path) -> Path:
    """Where run ``d``'s retrieval-off evaluation is: what ``slea eval --out RUN/eval_library_off`` wrote (the last
    ``eval_library_off/eval/*.json``), else the ``eval/library_off.json`` copy older run folders have."""
    made = sorted((d / "eval_library_off" / "eval").glob("*.json"))
    return made[-1] if made else d / "eval" / "library_off.json"


def library_off(seed: int, study: str = "compare") -> None:
    """(c) the slea run's final policy on the held-out games with retrieval off (``eval_library_off/eval/``)."""
    d = run_dir("slea", seed, study)
    if library_off_eval(d).is_file():
        print(f"{d}: library-off eval exists")
        return
    _cli("eval", str(d), "--set", "experience.mode=off", "--out", str(d / "eval_library_off"))


# -- tables ----------------------------------------------------------------------------------------------------
def _sampled(path: Path) -> dict[str, float]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return (data.get("after") or data).get("sampled") or {}


def _ms(xs: list[float]) -> str:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return "–"
    return f"{np.mean(xs):.3f} ± {np.std(xs, ddof=1):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"


def agent_table() -> str:
    rows = []
    for d in sorted((RESULTS / "agent").glob("s*/heldout/agent.json")):
        res = json.loads(d.read_text())
        build = json.loads((d.parent.parent / "build" / "agent.json").read_text())
        seed = int(d.parent.parent.name[1:])
        rows.append((seed, res, build))
    if not rows:
        return ""
    lines = [("| seed | library (entries: strategies / warnings) | held-out sampled success, no library | with the "
             "library | difference | greedy no library / library | steps that retrieved | invalid rate no library / "
             "library | training games while building: success without / with the evolving library |"),
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for seed, res, build in rows:
        lib = res["library"]["before"]
        w, o = res["without"]["sampled"], res["with"]["sampled"]
        gw, go = res["without"].get("greedy", {}), res["with"].get("greedy", {})
        bw, bo = build["without"]["sampled"], build["with"]["sampled"]
        lines.append(f"| {seed} | {int(lib['size'])} ({int(lib.get('size_pos', 0))} / {int(lib.get('size_neg', 0))}) "
                     f"| {w['success']:.3f} | {o['success']:.3f} | {o['success'] - w['success']:+.3f} | "
                     f"{gw.get('success', math.nan):.3f} / {go.get('success', math.nan):.3f} | "
                     f"{o['retrieval_hit_rate']:.2f} | {w['invalid_rate']:.3f} / {o['invalid_rate']:.3f} | "
                     f"{bw['success']:.3f} / {bo['success']:.3f} |")
    d = [r["with"]["sampled"]["success"] - r["without"]["sampled"]["success"] for _, r, _ in rows]
    lines.append(f"| mean | | {_ms([r['without']['sampled']['success'] for _, r, _ in rows])} | "
                 f"{_ms([r['with']['sampled']['success'] for _, r, _ in rows])} | {_ms(d)} | | | | |")
    pairs = [stats.paired_comparison({s: r["with"][mode]["success"] for s, r, _ in rows if mode in r["with"]},
                                     {s: r["without"][mode]["success"] for s, r, _ in rows if mode in r["without"]},
                                     names=("library", "no library"), metric=f"held-out {mode} success")
             for mode in ("sampled", "greedy")]
    lines += ["", ("With the library against without it, paired by seed (the frozen model; agent.json keeps no "
                   "per-game outcome, so the CI resamples seeds):"), "", *(f"- {stats.summary_line(c)}" for c in pairs)]
    return "\n".join(lines) + "\n"


ARM_ORDER = ("slea", "slea_task", "slea_off", "grpo", "gigpo")  # the tables' order; arms come from the run folders
BASELINE = "grpo"


def finished(folder: Path | None = None) -> list[compare.SubRun]:
    """The finished runs under ``folder`` (default ``RESULTS/compare``), arms read from the folder names
    ``runs/<arm>-s<seed>/``."""
    return compare.finished_runs(folder or RESULTS / "compare", ARM_ORDER)


def _games(path: Path) -> list[float] | None:
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return stats.per_game_success(data.get("after") or data)


def comparisons(runs: list[compare.SubRun]) -> list[stats.PairedComparison]:
    """Every arm against :data:`BASELINE`; slea against each of its own variants (``slea_*``: the pass criterion's
    slea − slea_task); and (c), slea's policies with retrieval against the same policies with retrieval off at
    evaluation. Each paired by seed, with the exact sign-flip p and the bootstrap CI over seeds and held-out games
    (:func:`slea.compare.paired`)."""
    arms = list(dict.fromkeys(r.algorithm for r in runs))
    pairs = [(a, BASELINE) for a in arms if a != BASELINE] if BASELINE in arms else []
    pairs += [("slea", a) for a in arms if a.startswith("slea_")] if "slea" in arms else []
    out = [compare.paired(runs, a, b) for a, b in pairs]
    mine = [r for r in runs if r.algorithm == "slea" and library_off_eval(r.dir).is_file()]
    if mine:
        out.append(stats.paired_comparison(
            {r.seed: _sampled(r.dir / "eval" / "summary.json").get("success") for r in mine},
            {r.seed: _sampled(library_off_eval(r.dir)).get("success") for r in mine},
            a_games={r.seed: _games(r.dir / "eval" / "summary.json") for r in mine},
            b_games={r.seed: _games(library_off_eval(r.dir)) for r in mine},
            names=("slea", "slea, retrieval off at eval (c)")))
    return out


def compare_table(folder: Path | None = None) -> str:
    """table.md's text for the compare folder ``folder`` (default ``RESULTS/compare``); writes its table.json and
    curves.png. Arms are the run folders' names (``runs/<arm>-s<seed>/``), so added arms join the table."""
    folder = folder or RESULTS / "compare"
    runs = finished(folder)
    if not runs:
        return ""
    arms = list(dict.fromkeys(r.algorithm for r in runs))
    tab = compare.summarize_runs(runs, baseline=BASELINE if BASELINE in arms else None)
    pairs = comparisons(runs)
    tab["pairs"] = [c.to_dict() for c in pairs]
    tab["baseline"] = BASELINE if BASELINE in arms else arms[0]
    held = {(r.algorithm, r.seed): _sampled(r.dir / "eval" / "summary.json").get("success") for r in runs}
    vs = {c.a: c for c in pairs if c.b == BASELINE}
    saved = folder / "compare.json"  # the --set every sub-run of the folder shared (the last run's spec)
    overrides = json.loads(saved.read_text()).get("overrides", []) if saved.is_file() else []
    lines = [compare.table_markdown({**tab, "pairs": [], "spec": {"config": "configs/control_recall.yaml",
                                                                   "seeds": sorted({r.seed for r in runs}),
                                                                   "overrides": overrides}}).rstrip(),
             "", (f"| arm | seeds | held-out success (64 per seed) | − {BASELINE}, paired by seed (p, 95% CI) | "
                  "held-out with retrieval off | steps that retrieved, held-out | library entries (strategies / "
                  "warnings) |"),
             "|---|---:|---:|---:|---:|---:|---|"]
    for algo in arms:
        mine = sorted((r for r in runs if r.algorithm == algo), key=lambda r: r.seed)
        vals = [held[(algo, r.seed)] for r in mine]
        off = [_sampled(library_off_eval(r.dir)).get("success") for r in mine]
        hit = [_sampled(r.dir / "eval" / "summary.json").get("retrieval_hit_rate") for r in mine]
        sizes = []
        for r in mine:
            rows = [json.loads(x) for x in (r.dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
            last = rows[-1] if rows else {}
            if "library/size" in last:
                sizes.append(f"{int(last['library/size'])} ({int(last.get('library/size_pos', 0))} / "
                             f"{int(last.get('library/size_neg', 0))})")
        per = ", ".join(f"s{r.seed} {v:.3f}" for r, v in zip(mine, vals))
        c = vs.get(algo)
        diff = (f"{stats.format_mean_std(c)} (n={c.n}, p = {stats.format_p(c.p)}, CI {stats.format_ci(c.ci)})"
                if c is not None and c.n else "–")
        off_vals = [x for x in off if x is not None]
        lines.append(f"| {algo} | {len(mine)} | {_ms(vals)} ({per}) | {diff} | {_ms(off_vals) if off_vals else '–'} | "
                     f"{_ms([x for x in hit if x is not None])} | {', '.join(sizes) or '–'} |")
    if pairs:
        lines += ["", "Every comparison, paired by seed (held-out sampled success):", "",
                  stats.markdown_table(pairs).rstrip()]
    if any((r.dir / "trace" / "steps.jsonl").is_file() for r in runs):  # the powered study's secondary analyses
        lines += ["", ("Secondary analyses (none deciding): iterations count from 0; winning lessons: strategies "
                       "created by then that name the right gesture of a chamber they are linked to (a lower "
                       "bound); held-out wins from `slea agent --trace` with the final policy and library:"), "",
                  secondary_markdown(secondary(folder)).rstrip()]
    compare.plot_compare(runs, folder / "curves.png")
    (folder / "table.json").write_text(json.dumps(tab, indent=2))
    return "\n".join(lines) + "\n"


def table(folder: Path | None = None) -> None:
    """agent.md (when (a) has runs) and the compare folder's table.md/json and curves.png (``folder``, default
    ``RESULTS/compare``)."""
    compare.relativize(RESULTS)
    folder = folder or RESULTS / "compare"
    a, b = agent_table(), compare_table(folder)
    if a:
        (RESULTS / "agent.md").write_text(a)
        print(a)
    if b:
        (folder / "table.md").write_text(b)
        print(b)


# -- the powered study's secondary analyses (reported, none deciding) ----------------------------------------------
def first_success(d: Path) -> int | None:
    """The first training iteration (from 0) with a won episode, from the run's metrics.jsonl; None: none."""
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return next((int(r.get("iteration", i)) for i, r in enumerate(rows) if (r.get("train/success") or 0) > 0), None)


def winning_lessons(library: Path, by_iteration: int) -> int:
    """The strategies of ``library`` created at or before ``by_iteration`` that name the right gesture of a chamber
    type they are linked to (a cluster whose prototype is that chamber). A lower bound: entries merged or evicted
    before the end are not in the final library."""
    import sqlite3

    from slea.envs.recall import RIGHT

    conn = sqlite3.connect(f"file:{library}?mode=ro", uri=True)
    try:
        kind = {cid: chamber_of(proto) for cid, proto in conn.execute("SELECT cid, prototype FROM obs_clusters")}
        links: dict[int, set[int]] = {}
        for eid, cid in conn.execute("SELECT entry_id, cluster_id FROM entry_clusters"):
            links.setdefault(eid, set()).add(cid)
        rows = conn.execute("SELECT id, text FROM entries WHERE zone = 'pos' AND created_iter <= ?",
                            (by_iteration,)).fetchall()
    finally:
        conn.close()
    return sum(any(RIGHT.get(kind.get(c, "")) in named_gestures(text) for c in links.get(eid, ())) for eid, text in rows)


def followed_on_wins(steps: Path) -> dict[str, float]:
    """Over a trace's won episodes with the library (``slea agent --trace`` rows, condition ``with``): the steps
    that retrieved lessons, and the share whose answer is a gesture the top lesson names."""
    rows = [json.loads(x) for x in steps.read_text().splitlines() if x.strip()]
    won = [r for r in rows if r["condition"] == "with" and r.get("won") and r.get("experiences")]
    top = [r for r in won if r.get("valid") and r["action"] in named_gestures(r["experiences"][0].get("text"))]
    return {"steps": len(won), "followed": len(top) / len(won) if won else math.nan}


def secondary(folder: Path) -> list[dict[str, Any]]:
    """Per seed of the study under ``folder``: each arm's first training iteration with a success; for slea, the
    winning lessons its library held by then and the lesson-followed rate on held-out wins (``trace/``)."""
    out = []
    runs = finished(folder)
    for seed in sorted({r.seed for r in runs}):
        row: dict[str, Any] = {"seed": seed}
        for r in (r for r in runs if r.seed == seed):
            row[f"{r.algorithm}_first_success"] = first_success(r.dir)
            if r.algorithm == "slea":
                first = row["slea_first_success"]
                lib = r.dir / "library.sqlite"
                row["slea_winning_lessons_then"] = (winning_lessons(lib, first)
                                                    if first is not None and lib.is_file() else None)
                trace = r.dir / "trace" / "steps.jsonl"
                row["slea_heldout_wins"] = followed_on_wins(trace) if trace.is_file() else None
        out.append(row)
    return out


def secondary_markdown(rows: list[dict[str, Any]]) -> str:
    """The secondary analyses as a table (:func:`secondary`)."""
    def cell(x: Any) -> str:
        return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else str(x)

    head = ("| seed | slea: first training success | grpo: first training success | slea: winning lessons by then | "
            "slea: held-out win steps with lessons | of them, answer = the top lesson's gesture |")
    lines = [head, "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        wins = r.get("slea_heldout_wins") or {}
        followed = wins.get("followed")
        lines.append(f"| {r['seed']} | {cell(r.get('slea_first_success'))} | {cell(r.get('grpo_first_success'))} | "
                     f"{cell(r.get('slea_winning_lessons_then'))} | {cell(wins.get('steps'))} | "
                     f"{'–' if followed is None or math.isnan(followed) else f'{followed:.2f}'} |")
    return "\n".join(lines) + "\n"


# -- the powered study's size ------------------------------------------------------------------------------------
PILOT, BASELINE_STUDIES = "eight_seeds", ("eight_seeds", "eight_seeds_ent0.03")
POWER = {"target": 0.8, "alpha": stats.ALPHA, "n_sims": 10_000, "seed": 0, "first_seed": 102}
USED_SEEDS = {100, 101}  # the anti-collapse pilots (pilot/*/runs/grpo-s100, -s101)


def power_inputs() -> dict[str, Any]:
    """The pilot's per-seed slea − grpo differences (``eight_seeds``), and grpo's held-out scores on every seed of
    both 8-seed studies: how often grpo scored at all, and how much where it did."""
    pilot = compare.paired(finished(RESULTS / PILOT), "slea", BASELINE)
    scores = [_sampled(r.dir / "eval" / "summary.json").get("success") or 0.0
              for study in BASELINE_STUDIES for r in finished(RESULTS / study) if r.algorithm == BASELINE]
    won = [x for x in scores if x > 0]
    return {"pilot_seeds": list(pilot.seeds), "pilot_diffs": list(pilot.diffs), "baseline_scores": scores,
            "baseline_rate": len(won) / len(scores) if scores else 0.0, "baseline_won": won}


def power() -> dict[str, Any]:
    """The powered study's seed count (module docstring, ``power``), with the power of that count under two
    harsher models beside it; writes ``powered/power.{json,md}``."""
    x = power_inputs()
    kw = {k: POWER[k] for k in ("alpha", "n_sims", "seed")}
    n, curve = study_power.seeds_for_power(x["pilot_diffs"], target=POWER["target"], loss_rate=x["baseline_rate"],
                                           baseline_scores=x["baseline_won"] or None, n_min=6, **kw)
    if n is None:
        raise SystemExit("no study of up to 64 seeds reaches the target power")
    models = {"grpo never scores": {"loss_rate": 0.0},
              "grpo scores twice as often (same scores)": {"loss_rate": min(1.0, 2 * x["baseline_rate"]),
                                                           "baseline_scores": x["baseline_won"] or None},
              "grpo scores on 1 seed in 16, as much as slea where slea wins": {"loss_rate": 1 / 16}}
    harsher = {name: study_power.sign_flip_power(x["pilot_diffs"], n, **m, **kw).power for name, m in models.items()}
    seeds = [s for s in range(POWER["first_seed"], POWER["first_seed"] + n + len(USED_SEEDS))
             if s not in USED_SEEDS][:n]
    out = {**x, **POWER, "n_seeds": n, "seeds": seeds,
           "curve": [{"n": r.n, "power": r.power, "stderr": r.stderr} for r in curve], "harsher": harsher}
    folder = RESULTS / "powered"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "power.json").write_text(json.dumps(out, indent=2) + "\n")
    md = ["| seeds | power (design model) | Monte Carlo s.e. |", "|---:|---:|---:|",
          *(f"| {r['n']} | {r['power']:.3f} | {r['stderr']:.3f} |" for r in out["curve"]),
          "", f"At {n} seeds under other models:", "",
          *(f"- {name}: {pw:.3f}" for name, pw in harsher.items())]
    (folder / "power.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("agent")
    a.add_argument("--seed", type=int, required=True)
    a.add_argument("--set", dest="extra", action="append", default=[])
    r = sub.add_parser("run")
    r.add_argument("--arm", "--algo", dest="arm", choices=list(ARMS), required=True)
    r.add_argument("--seed", type=int, required=True)
    r.add_argument("--study", default="compare", help="the results folder under RESULTS (default: compare)")
    r.add_argument("--set", dest="extra", action="append", default=[])
    t = sub.add_parser("table")
    t.add_argument("--study", default="compare", help="the results folder under RESULTS (default: compare)")
    t.add_argument("--compare", type=Path, default=None, help="a compare folder elsewhere (runs/<arm>-s<seed>/ "
                   "under it), instead of --study")
    sub.add_parser("power")
    tr = sub.add_parser("trace")
    tr.add_argument("--seed", type=int, required=True)
    tr.add_argument("--study", required=True)
    tr.add_argument("--set", dest="extra", action="append", default=[])
    d = sub.add_parser("diagnose")
    d.add_argument("--seed", type=int, required=True)
    d.add_argument("--set", dest="extra", action="append", default=[])
    args = ap.parse_args(argv)
    if args.cmd == "agent":
        agent(args.seed, args.extra)
    elif args.cmd == "power":
        power()
    elif args.cmd == "trace":
        trace(args.seed, args.study, args.extra)
    elif args.cmd == "diagnose":
        diagnose(args.seed, args.extra)
    elif args.cmd == "run":
        run(args.arm, args.seed, args.extra, args.study)
    else:
        table(args.compare or RESULTS / args.study)


if __name__ == "__main__":
    main()
