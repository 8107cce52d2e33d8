"""Tables like tlm-DRE's Table 1: prompt-only, SFT, DPO, turn-DPO, DIL, tlm-DRE and SFT then GRPO,
on the seen and unseen splits of ALFWorld-Gen (success %) and ScienceWorld (average score), mean ± std over seeds.

Every run goes through the ``slea`` command line (``slea align``, ``slea train``, ``slea eval``) with a preset
(``configs/align_<env>.yaml``) and is kept under ``experiments/results/align/<env>/runs/<method>-s<seed>/``: a finished
run (every ``eval/eval-<split>.json`` of the preset's ``align.eval_splits`` written) is reused, an interrupted one
resumes (``slea align --resume``, ``slea train --resume``: the stage that was running is redone). One run per
invocation, so a 2-core machine runs them one at a time; ``$SLEA_ALIGN_DIR`` puts the results elsewhere::

    python experiments/align_table.py run --env alfworld --method sft --seed 0       # first: the seed's SFT run
    python experiments/align_table.py run --env alfworld --method tlm_dre --seed 0   # dpo, turn_dpo, dil likewise
    python experiments/align_table.py run --env alfworld --method sft_grpo --seed 0  # slea train from the SFT run
    python experiments/align_table.py run --env alfworld --method prompt --seed 0    # the untrained model
    python experiments/align_table.py plan --env alfworld --seeds 0,1,2              # what is done, what runs next
    python experiments/align_table.py table --env alfworld                           # table.md / table.json

What is shared, so SFT is trained once per seed: ``sft`` is ``slea align --method sft`` (expert data, SFT,
evaluation). A pair method's run folder is seeded with that run's expert data, ``sft.json`` and SFT checkpoint
(``checkpoints/iter_000001``), and with the samples and pairs of another pair method's run of the same seed when
one has them (same SFT policy, same sampling settings), before ``slea align --method M`` starts; the pipeline
skips a stage whose output exists, so it runs only what is missing (the first pair method of a seed samples,
the others align and evaluate). ``shared.json`` in the run folder says what came from where. Runs are shared
only between identical configurations (the saved ``config.yaml`` files, less ``align.method`` and ``run.dir``);
a run made with another preset is refused with the keys that differ.

The copies are not kept: once a run has finished, a copy still byte-identical to its source is deleted (``prune``
does it for every run of an env), so the committed folders hold each file once and ``shared.json`` says where it
is. A resumed run gets its copies back from ``shared.json`` before the pipeline starts (``restore`` does it for
every run of an env, e.g. to read a run folder whole)::

    python experiments/align_table.py restore --env alfworld   # re-create the shared copies from shared.json
    python experiments/align_table.py prune --env alfworld     # delete the copies identical to their source

``sft_grpo`` is ``slea train`` (the preset's ``algorithm``/``train`` sections: GRPO) with ``model.init_from`` the
seed's SFT run, then ``slea eval`` on each split. ``prompt`` is ``slea eval`` of the preset with no training (a
fresh LoRA adapter is the identity); with greedy evaluation it does not depend on the seed.

Envs: ``alfworld``, ``scienceworld``, ``searchqa`` (one split, EM / F1), ``searchqa_answer`` (``searchqa`` on the
questions whose evidence contains the answer: :data:`JOBS`) and ``tiny`` (configs/align_tiny.yaml
made smaller: the tiny random model on TextWorld, a wiring check in minutes).
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slea import compare
from slea.evaluation import stats
from slea.runs import folder as run_files
from slea.runs.folder import RunFolder

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(os.environ.get("SLEA_ALIGN_DIR") or ROOT / "experiments" / "results" / "align")
UNTRAINED = ROOT / "experiments" / "results" / "untrained_eval.json"


@dataclass(frozen=True)
class Job:
    config: str  # preset, relative to the repository
    metric: str  # success | score | em_f1
    family: str  # experiments/results/untrained_eval.json's family key
    heldout: str  # which of this job's splits the env's "heldout" alias is (for untrained_eval.json's row)
    overrides: tuple[str, ...] = ()


JOBS: dict[str, Job] = {
    "alfworld": Job("configs/align_alfworld.yaml", "success", "alfworld", "unseen"),
    "scienceworld": Job("configs/align_scienceworld.yaml", "score", "scienceworld", "seen"),
    "searchqa": Job("configs/align_searchqa.yaml", "em_f1", "search_qa", "heldout"),
    # the same preset on the questions whose evidence documents contain a gold answer (the preset keeps those whose
    # evidence documents are in the corpus): there a search for the question returns the answer for 58 of 71 train
    # and 17 of 18 held-out questions, on the preset's questions for 76 of 434 and 20 of 124 (docs/alignment.md)
    "searchqa_answer": Job("configs/align_searchqa.yaml", "em_f1", "search_qa", "heldout",
                           ("env.kwargs.answerable=answer", "eval.games=18")),
    "tiny": Job("configs/align_tiny.yaml", "success", "textworld", "heldout",
                ("align.expert_episodes=2", "align.samples_per_task=1", "eval.games=1", "train.iterations=1",
                 "eval.before=false")),
}
METHODS = ("prompt", "sft", "dpo", "turn_dpo", "dil", "tlm_dre", "sft_grpo")
PAIR_METHODS = ("dpo", "turn_dpo", "dil", "tlm_dre")
LABELS = {"prompt": "prompt-only (untrained)", "sft": "SFT", "dpo": "DPO (ETO)", "turn_dpo": "turn-DPO (w/o DRE)",
          "dil": "DIL (w/o tlm)", "tlm_dre": "tlm-DRE", "sft_grpo": "SFT + GRPO"}
# stage outputs a pair method's run takes over: from the seed's SFT run, then from a sibling pair-method run
# (in this order: the file that marks a stage done is copied last)
FROM_SFT = (f"{run_files.CHECKPOINTS}/iter_000001", run_files.EXPERT, run_files.SFT)
FROM_SIBLING = (run_files.SAMPLES, run_files.PAIRS)
# config keys that may differ between runs that share stages
FREE_KEYS = (("align", "method"), ("run", "dir"))


def slea(*args: str) -> list[str]:
    return [sys.executable, "-m", "slea.cli", *args]


def env_dir(env: str, root: Path | None = None) -> Path:
    return (root or RESULTS) / env


def run_dir(env: str, method: str, seed: int, root: Path | None = None) -> Path:
    return env_dir(env, root) / "runs" / f"{method}-s{seed}"


def preset(env: str, seed: int):
    """The job's config for ``seed`` (a :class:`slea.config.RunConfig`)."""
    from slea.config import load_config

    job = JOBS[env]
    return load_config(ROOT / job.config, [*job.overrides, f"run.seed={seed}"])


def config_diff(run: Path, cfg, free=FREE_KEYS) -> list[str]:
    """The keys (``section.key``) where ``run``'s saved config.yaml differs from ``cfg`` (less ``free``)."""
    return compare.config_diff(RunFolder(run).config, cfg, free)


def finished(env: str, method: str, seed: int, root: Path | None = None, splits: list[str] | None = None) -> bool:
    d = run_dir(env, method, seed, root)
    splits = splits if splits is not None else preset(env, seed).align.eval_splits
    return all(RunFolder(d).evaluation(f"eval-{s}").is_file() for s in splits)


@dataclass
class Plan:
    env: str
    method: str
    seed: int
    dir: Path
    state: str  # finished | new | resume | blocked
    commands: list[list[str]] = field(default_factory=list)
    copies: list[tuple[Path, Path]] = field(default_factory=list)  # (source, destination) stage outputs
    redo: list[str] = field(default_factory=list)  # stage outputs removed first, so the pipeline redoes the stage
    note: str = ""


def plan(env: str, method: str, seed: int, root: Path | None = None) -> Plan:
    """What ``run`` would do for (env, method, seed): nothing (finished), start, resume, or refuse (blocked)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
    cfg = preset(env, seed)
    job, splits = JOBS[env], cfg.align.eval_splits
    d = run_dir(env, method, seed, root)
    p = Plan(env, method, seed, d, "new")
    missing = [s for s in splits if not RunFolder(d).evaluation(f"eval-{s}").is_file()]
    if not missing and method == "sft" and not (d / FROM_SFT[0] / "trainable.safetensors").is_file():
        # evaluated, but a fresh checkout has no weights (checkpoints are not committed): the pair methods and
        # sft_grpo need them, so the SFT stage is trained again (same preset and seed) and the evaluations kept
        p.state, p.redo = "resume", [run_files.SFT]
        p.commands = [slea("align", "--resume", str(d))]
        p.note = "evaluated, but its weights are not in this checkout: the SFT stage is trained again"
        return p
    if not missing:
        p.state, p.note = "finished", "every split evaluated"
        return p
    started = RunFolder(d).config.is_file()
    if started:
        diff = config_diff(d, cfg, (*FREE_KEYS, ("model", "init_from")) if method == "sft_grpo" else FREE_KEYS)
        if diff:
            return _blocked(p, f"{d} was made with another configuration ({', '.join(diff)})")
    sets = [*(x for o in job.overrides for x in ("--set", o)), "--set", f"run.seed={seed}", "--set", f"run.dir={d}"]
    if method == "prompt":
        p.commands = [slea("eval", str(ROOT / job.config), "--split", s, "--out", str(d),
                           *(x for o in job.overrides for x in ("--set", o)), "--set", f"run.seed={seed}")
                      for s in missing]
        p.note = f"slea eval of the untrained model on {', '.join(missing)}"
        return p
    if method == "sft":
        p.state = "resume" if started else "new"
        p.commands = [slea("align", "--resume", str(d))] if started else \
            [slea("align", str(ROOT / job.config), "--method", "sft", *sets)]
        return p
    sft = run_dir(env, "sft", seed, root)
    if not started:
        if not RunFolder(sft).sft.is_file() or not (sft / FROM_SFT[0] / "trainable.safetensors").is_file():
            return _blocked(p, f"no finished SFT stage in {sft}: run --method sft --seed {seed} first")
        diff = config_diff(sft, cfg)
        if diff:
            return _blocked(p, f"{sft} was made with another configuration ({', '.join(diff)})")
    if method == "sft_grpo":
        if not RunFolder(d).summary.is_file():
            p.commands.append(slea("train", "--resume", str(d)) if started else
                              slea("train", str(ROOT / job.config), *sets, "--set", f"model.init_from={sft}"))
        p.commands += [slea("eval", str(d), "--split", s) for s in missing]
        p.state = "resume" if started else "new"
        p.note = f"GRPO from {sft.name}'s SFT weights, then slea eval on {', '.join(missing)}"
        return p
    # a pair method
    if started:
        p.state, p.commands = "resume", [slea("align", "--resume", str(d))]
        return p
    p.copies = [(sft / f, d / f) for f in FROM_SFT]
    sibling = _sibling_with_samples(env, method, seed, cfg, root)
    if sibling is not None:
        p.copies += [(source(sibling, f), d / f) for f in FROM_SIBLING]
    p.commands = [slea("align", str(ROOT / job.config), "--method", method, *sets)]
    p.note = f"expert data and SFT from {sft.name}" + (f"; samples and pairs from {sibling.name}" if sibling
                                                        else "; samples its own failures")
    return p


def _blocked(p: Plan, note: str) -> Plan:
    p.state, p.note, p.commands, p.copies = "blocked", note, [], []
    return p


def _sibling_with_samples(env: str, method: str, seed: int, cfg, root: Path | None) -> Path | None:
    for other in PAIR_METHODS:
        d = run_dir(env, other, seed, root)
        if other != method and all(source(d, f).is_file() for f in FROM_SIBLING) and RunFolder(d).config.is_file() \
                and not config_diff(d, cfg):
            return d
    return None


def shared(d: Path) -> dict[str, str]:
    """Run folder ``d``'s ``shared.json``: each stage output it took over (relative to ``d``) and where from
    (relative to the env's folder, ``runs/<run>/<file>``); empty when it took none."""
    f = d / "shared.json"
    return json.loads(f.read_text()) if f.is_file() else {}


def source(d: Path, name: str) -> Path:
    """Where run ``d``'s stage output ``name`` is: ``d/name`` when it is there, else where ``shared.json`` says it
    was copied from (:func:`upstream`); ``d/name`` when nothing records it."""
    here = d / name
    return here if here.exists() else upstream(d, name) or here


def upstream(d: Path, name: str, depth: int = 0) -> Path | None:
    """The file run ``d``'s copy ``name`` was made from (``shared.json``), followed through runs that hold no copy
    themselves (a sibling's samples may be the copy of another sibling's); None when nothing records it."""
    src = shared(d).get(name)
    if src is None or depth > 16:
        return None
    parts = Path(src).parts  # runs/<run>/<file>
    run, rel = d.parents[1].joinpath(*parts[:2]), "/".join(parts[2:])
    return run / rel if (run / rel).exists() else upstream(run, rel, depth + 1)


def restore_shared(d: Path) -> list[str]:
    """Put back the copies run ``d`` took over (``shared.json``) that are not in the folder, from their sources.
    The names restored; a source that is not there either (an SFT checkpoint on a fresh checkout) is skipped."""
    done = []
    for name in shared(d):
        src = upstream(d, name)
        if not (d / name).exists() and src is not None:
            _copy(src, d / name)
            done.append(name)
    return done


def prune_shared(d: Path) -> list[str]:
    """Delete the files run ``d`` took over (``shared.json``) that are byte-identical to their source: the
    committed folder holds each file once, and :func:`restore_shared` re-creates them. The names deleted; a copy
    the run changed, and folders (checkpoints, not committed), stay."""
    done = []
    for name in shared(d):
        dst, src = d / name, upstream(d, name)
        if dst.is_file() and src is not None and src.is_file() and filecmp.cmp(dst, src, shallow=False):
            dst.unlink()
            done.append(name)
    return done


def _copy(src: Path, dst: Path) -> None:
    """Copy a file or folder so that ``dst`` appears whole or not at all."""
    if dst.exists():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    part = dst.with_name(dst.name + ".part")
    if part.is_dir():
        shutil.rmtree(part)
    if src.is_dir():
        shutil.copytree(src, part)
    else:
        shutil.copy2(src, part)
    os.replace(part, dst)


def seed_run(p: Plan) -> None:
    """Put the plan's shared stage outputs into its run folder and record their sources in shared.json."""
    for src, dst in p.copies:
        _copy(src, dst)
    if p.copies:
        base = p.dir.parents[1]
        shared = {str(dst.relative_to(p.dir)): str(src.relative_to(base)) for src, dst in p.copies}
        (p.dir / "shared.json").write_text(json.dumps(shared, indent=2) + "\n")


def run(env: str, method: str, seed: int, root: Path | None = None, execute=subprocess.run) -> Plan:
    p = plan(env, method, seed, root)
    print(f"{env} {method} seed {seed}: {p.state}" + (f" ({p.note})" if p.note else ""))
    if p.state == "blocked":
        raise SystemExit(2)
    seed_run(p)
    if p.commands and (back := restore_shared(p.dir)):  # a resumed run: its stage outputs taken over come back
        print(f"restored from shared.json: {', '.join(back)}")
    for name in p.redo:
        (p.dir / name).unlink(missing_ok=True)
    for cmd in p.commands:
        print("$ slea " + " ".join(cmd[3:]), flush=True)
        execute(cmd, check=True)
    compare.relativize(p.dir, ("experiments/results/align/", "configs/"))  # committed results name no machine's folder
    scrub_home(p.dir)
    if p.commands and finished(env, method, seed, root):
        prune_shared(p.dir)  # the copies go once the run is done: shared.json says where they are
    return p


def scrub_home(folder: Path, home: Path | None = None) -> int:
    """Write ``~`` for the home folder in the run's saved text files (checkpoints aside): the envs' provenance
    (e.g. ALFWorld's ``game_file`` in the expert data, under the home cache) names no machine's folder. The count
    of files changed; no stage reads those fields back."""
    home_dir = str(home or Path.home()).rstrip("/") + "/"
    changed = 0
    for f in Path(folder).rglob("*"):
        if f.suffix in (".json", ".jsonl", ".yaml", ".md") and f.is_file() and run_files.CHECKPOINTS not in f.parts:
            text = f.read_text()
            if home_dir in text:
                f.write_text(text.replace(home_dir, "~/"))
                changed += 1
    return changed


# -- the table -------------------------------------------------------------------------------------------------
def metrics(kind: str, result: dict) -> dict[str, float | None]:
    """The table's numbers of one ``eval-<split>.json``: success %, ScienceWorld's score (0-100), or EM / F1 %."""
    if kind == "success":
        s = (result.get("sampled") or {}).get("success")
        return {"success %": None if s is None else 100.0 * s}
    row = ((result.get("table") or {}).get("rows") or [{}])[0].get("values") or {}
    if kind == "score":
        key = next((k for k in ("All", "Seen", "Unseen", "Train") if k in row), None)
        return {"score": row.get(key) if key else None}
    em = row.get("Avg EM", next((v for k, v in row.items() if k.endswith(" EM")), None))
    f1 = row.get("Avg F1", next((v for k, v in row.items() if k.endswith(" F1")), None))
    return {"EM": em, "F1": f1}


def untrained_row(env: str, cfg, path: Path = UNTRAINED) -> tuple[dict[str, Any] | None, str]:
    """experiments/results/untrained_eval.json's sampled row for this job's family, when its settings are this preset's (env,
    steps, prompt budget, decoding); otherwise None and why."""
    job = JOBS[env]
    if not path.is_file():
        return None, f"{path.name} does not exist"
    fam = (json.loads(path.read_text()).get("families") or {}).get(job.family)
    if not fam or "sampled" not in fam:
        return None, f"{path.name} has no {job.family} result"
    s = fam.get("settings") or {}
    split = str((s.get("env_kwargs") or {}).get("split", ""))
    split = job.heldout if split == "heldout" else split
    mine = {"env": cfg.env.id, "max_steps": cfg.env.max_steps, "max_new_tokens": cfg.rollout.max_new_tokens,
            "obs_max_chars": cfg.rollout.obs_max_chars, "temperature": cfg.eval.temperature}
    theirs = {"env": fam.get("env"), "max_steps": s.get("max_steps"),
              "max_new_tokens": (s.get("rollout") or {}).get("max_new_tokens", 12),
              "obs_max_chars": (s.get("rollout") or {}).get("obs_max_chars", 400),
              "temperature": fam["sampled"].get("temperature")}
    diff = [f"{k} {theirs[k]} vs {mine[k]}" for k in mine if theirs[k] != mine[k]]
    if split not in cfg.align.eval_splits:
        diff.append(f"split {split or '?'} is none of {', '.join(cfg.align.eval_splits)}")
    if diff:
        return None, f"{path.name}'s {job.family} row not shown: its settings differ ({'; '.join(diff)})"
    return {"split": split, "metrics": metrics(job.metric, fam), "games": fam.get("games")}, ""


def collect(env: str, root: Path | None = None, untrained: Path = UNTRAINED) -> dict[str, Any]:
    """Every finished run of ``env``: per method and column, mean ± std over seeds (and the per-seed values)."""
    job = JOBS[env]
    cfg = preset(env, 0)
    splits = cfg.align.eval_splits
    rows: dict[str, Any] = {}
    for method in METHODS:
        per_seed: dict[int, dict[str, float | None]] = {}
        for d in sorted((env_dir(env, root) / "runs").glob(f"{method}-s*")):
            seed = int(d.name.rsplit("-s", 1)[1])
            if not all(RunFolder(d).evaluation(f"eval-{s}").is_file() for s in splits):
                continue
            per_seed[seed] = {f"{s} {k}": v for s in splits for k, v in
                              metrics(job.metric, json.loads(RunFolder(d).evaluation(f"eval-{s}").read_text())).items()}
        if per_seed:
            columns = list(next(iter(per_seed.values())))
            rows[method] = {"label": LABELS[method], "seeds": sorted(per_seed), "columns": {
                c: compare.stat([v[c] for v in per_seed.values() if v.get(c) is not None]) for c in columns}}
    extra, why = untrained_row(env, cfg, untrained)
    columns = [f"{s} {k}" for s in splits for k in metrics(job.metric, {})]
    return {"env": env, "env_id": cfg.env.id, "config": job.config, "overrides": list(job.overrides),
            "columns": columns, "rows": rows, "untrained_eval": extra, "untrained_eval_note": why,
            "eval": {"games": cfg.eval.games, "episodes_per_game": cfg.eval.episodes_per_game,
                     "temperature": cfg.eval.temperature, "max_steps": cfg.env.max_steps}}


# each aligned route against SFT (the policy it starts from, same seed), and tlm-DRE against DPO (the paper's claim)
PAIRS = (("dpo", "sft"), ("turn_dpo", "sft"), ("dil", "sft"), ("tlm_dre", "sft"), ("sft_grpo", "sft"),
         ("tlm_dre", "dpo"))


def _per_game(kind: str, result: dict, value: float | None) -> list[float] | None:
    """Each held-out game's value in the table's unit, where the table's number is the mean of the games' wins
    (success %; EM where a win is an exact answer): ``per_game_wins`` × 100; else None (a score keeps no per-game
    value)."""
    games = stats.per_game_success(result)
    if kind == "score" or games is None or value is None:
        return None
    games = [100.0 * g for g in games]
    return games if abs(sum(games) / len(games) - value) < 1e-6 else None


def comparisons(env: str, root: Path | None = None) -> list[dict[str, Any]]:
    """:data:`PAIRS` on each split's first column (success %, score, EM), paired by seed: per-seed differences,
    exact sign-flip p, bootstrap CI over seeds and held-out games (:func:`slea.evaluation.stats.paired_comparison`).
    Only finished runs; a pair with no common seed is left out."""
    job = JOBS[env]
    splits = preset(env, 0).align.eval_splits
    res: dict[str, dict[int, dict[str, dict]]] = {}
    for method in METHODS:
        for d in sorted((env_dir(env, root) / "runs").glob(f"{method}-s*")):
            if all(RunFolder(d).evaluation(f"eval-{sp}").is_file() for sp in splits):
                res.setdefault(method, {})[int(d.name.rsplit("-s", 1)[1])] = {
                    sp: json.loads(RunFolder(d).evaluation(f"eval-{sp}").read_text()) for sp in splits}
    out = []
    for sp in splits:
        key = next(iter(metrics(job.metric, {})))
        for a, b in PAIRS:
            if a not in res or b not in res:
                continue
            val = {m: {seed: metrics(job.metric, r[sp])[key] for seed, r in res[m].items()} for m in (a, b)}
            games = {m: {seed: _per_game(job.metric, r[sp], val[m][seed]) for seed, r in res[m].items()}
                     for m in (a, b)}
            c = stats.paired_comparison(val[a], val[b], a_games=games[a], b_games=games[b], names=(a, b),
                                        metric=f"{sp} {key}")
            if c.n:
                out.append(c.to_dict())
    return out


def _cell(st: dict[str, Any]) -> str:
    if not st or not st.get("n"):
        return "–"
    return f"{st['mean']:.1f} ± {st['std']:.1f}" if st["n"] > 1 else f"{st['mean']:.1f}"


def markdown(tab: dict[str, Any]) -> str:
    e = tab["eval"]
    decoding = "greedy" if e["temperature"] == 0 else f"sampled at T={e['temperature']:g}"
    lines = [f"**{tab['env_id']}: offline alignment** (`{tab['config']}`"
             + (f" with {' '.join(tab['overrides'])}" if tab["overrides"] else "") + ")", "",
             (f"Decoding: {decoding}; {e['games']} games x {e['episodes_per_game']} episode(s) per split, at most "
              f"{e['max_steps']} steps; mean ± std over seeds (sample std; one seed: the value)."), "",
             "| Method | " + " | ".join(tab["columns"]) + " | seeds |", "|---|" + "---|" * (len(tab["columns"]) + 1)]
    for r in tab["rows"].values():
        lines.append(f"| {r['label']} | " + " | ".join(_cell(r["columns"].get(c, {})) for c in tab["columns"])
                     + f" | {', '.join(map(str, r['seeds']))} |")
    u = tab["untrained_eval"]
    if u:
        cells = [f"{u['metrics'][c.split(' ', 1)[1]]:.1f}" if c.startswith(u["split"] + " ") else "–"
                 for c in tab["columns"]]
        lines.append(f"| prompt-only (untrained_eval.json, {u['games']} games) | " + " | ".join(cells) + " | – |")
    if tab["untrained_eval_note"]:
        lines += ["", f"_{tab['untrained_eval_note']}_"]
    if tab.get("pairs"):
        lines += ["", "Paired by seed (each route against the same seed's SFT run; tlm-DRE against DPO):", "",
                  stats.markdown_table(tab["pairs"], digits=1).rstrip()]
    return "\n".join(lines) + "\n"


def table(env: str, root: Path | None = None, untrained: Path = UNTRAINED) -> dict[str, Any]:
    tab = collect(env, root, untrained)
    if not tab["rows"]:
        raise SystemExit(f"no finished run under {env_dir(env, root) / 'runs'}")
    tab["pairs"] = comparisons(env, root)
    out = env_dir(env, root)
    (out / "table.json").write_text(json.dumps(tab, indent=2) + "\n")
    (out / "table.md").write_text(markdown(tab))
    print(markdown(tab))
    return tab


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["run", "plan", "table", "restore", "prune"])
    ap.add_argument("--env", required=True, choices=sorted(JOBS))
    ap.add_argument("--method", choices=METHODS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", default=None, help="plan: comma-separated seeds (default: --seed)")
    a = ap.parse_args(argv)
    if a.what == "table":
        table(a.env)
    elif a.what in ("restore", "prune"):
        act = restore_shared if a.what == "restore" else prune_shared
        for d in sorted((env_dir(a.env) / "runs").glob(f"{a.method or '*'}-s*")):
            for name in act(d):
                print(f"{a.what}d {d / name}")
    elif a.what == "plan":
        seeds = [int(s) for s in a.seeds.split(",")] if a.seeds else [a.seed]
        for seed in seeds:
            for method in [a.method] if a.method else METHODS:
                p = plan(a.env, method, seed)
                print(f"{method:>9} s{seed}: {p.state:<8} {p.note}")
    elif a.method is None:
        ap.error("--method is needed")
    else:
        run(a.env, a.method, a.seed)


if __name__ == "__main__":
    main()
