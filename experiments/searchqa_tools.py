"""Search-QA with tags against Search-QA as tools, trained the same way: is the tool protocol learnable by the
embedded model, and how does it compare with the tag version (docs/results/searchqa_tools.md)?

Two arms (:data:`ARMS`): ``tags`` plays ``slea/SearchQA-v0`` (``<search>…</search>`` / ``<answer>…</answer>``),
``tools`` plays ``slea/SearchQA-tools-v0`` (``search(query)`` / ``answer(text)`` calls in the model's tool-call
syntax): the same questions (the answerable subset, ``env.kwargs.answerable=answer``: 71 train, 18 held-out), the
same corpus, retriever and EM/F1, the same preset (``configs/align_searchqa.yaml``) with the same overrides
(:data:`COMMON`: every held-out question once, and one response budget, ``rollout.max_new_tokens=64``, that a
tool call fits), so the arms differ only in ``env.id``. Per arm and seed the pipeline is the ``sft_grpo`` route
of experiments/align_table.py, the one that lifted the tag version's held-out EM from 0:

1. ``slea align --method sft``: the env's expert (search for the question, then answer the gold answer; the tools
   version writes it as tool calls) on 32 train questions, 3 epochs of SFT, then the held-out evaluation of the
   SFT policy, in ``RESULTS/sft/<arm>-s<seed>/``;
2. ``slea train`` from that policy (``model.init_from``): GRPO, 6 iterations x 8 groups x 4 episodes, then the
   held-out evaluation (greedy, 18 questions), in ``RESULTS/runs/<arm>-s<seed>/``.

For a given seed both arms train on the same question groups in every iteration and are scored on the same 18
held-out questions. A finished stage is reused, an interrupted one resumed (``--resume``); a folder made with
other settings is refused with the keys that differ. ``timing.json`` in the run folder records each stage's
seconds as this script ran it.

``table`` writes ``RESULTS/table.md`` and ``table.json``: per arm and seed the held-out EM and F1 (after GRPO,
and after SFT alone), the invalid-step rate and episode length of the held-out episodes, the final train
success, the wall time; mean ± std over seeds; and tools − tags paired by seed, each with its exact sign-flip p
and bootstrap CI (:mod:`slea.evaluation.stats`).

    python experiments/searchqa_tools.py run --arm tags --seed 0
    python experiments/searchqa_tools.py run --arm tools --seed 0
    python experiments/searchqa_tools.py table
    python experiments/searchqa_tools.py settings-pilot --arm tools   # the third run's settings (training split)

``--set KEY=VALUE`` (repeatable) overrides the config of both stages; ``$SLEA_SEARCHQA_TOOLS_DIR`` puts the results
elsewhere.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from slea import compare
from slea.evaluation import stats
from slea.runs.folder import CHECKPOINTS, RunFolder

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(
    os.environ.get("SLEA_SEARCHQA_TOOLS_DIR") or ROOT / "experiments" / "results" / "searchqa_tools"
)
CONFIG = ROOT / "configs" / "align_searchqa.yaml"
ARMS = {"tags": "slea/SearchQA-v0", "tools": "slea/SearchQA-tools-v0"}
BASELINE = "tags"
# what both arms share beyond the preset: the answerable questions, every held-out question once (18), and one
# response budget (a search call with the question as its query is up to 44 tokens, EOS included)
COMMON = ("env.kwargs.answerable=answer", "eval.games=18", "rollout.max_new_tokens=64")
SFT_WEIGHTS = Path(CHECKPOINTS) / "iter_000001" / "trainable.safetensors"
# config keys that may differ from a saved config.yaml without refusing the folder
FREE = (("run", "dir"), ("run", "name"), ("align", "method"), ("model", "init_from"))
SEEDS_TO_CLAIM = 8  # the seeds a claim that one arm beats the other needs


def slea(*args: str) -> list[str]:
    return [sys.executable, "-m", "slea.cli", *args]


def sft_dir(arm: str, seed: int, root: Path | None = None) -> Path:
    return (root or RESULTS) / "sft" / compare.run_name(arm, seed)


def run_dir(arm: str, seed: int, root: Path | None = None) -> Path:
    return (root or RESULTS) / "runs" / compare.run_name(arm, seed)


def overrides(arm: str, seed: int, extra: list[str] | None = None) -> list[str]:
    """Both stages' settings beyond the preset: :data:`COMMON`, the arm's env, ``--set``, the seed."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; known: {', '.join(ARMS)}")
    return [*COMMON, f"env.id={ARMS[arm]}", *(extra or []), f"run.seed={seed}"]


def _sets(over: list[str]) -> list[str]:
    return [x for o in over for x in ("--set", o)]


def _refuse_other_config(d: Path, over: list[str]) -> None:
    from slea.config import load_config

    if not RunFolder(d).config.is_file():
        return
    diff = compare.config_diff(RunFolder(d).config, load_config(CONFIG, over, check_unused=False), FREE)
    if diff:
        raise SystemExit(
            f"{d} was made with other settings ({', '.join(diff)}): remove it or use $SLEA_SEARCHQA_TOOLS_DIR"
        )


def commands(
    arm: str, seed: int, extra: list[str] | None = None, root: Path | None = None
) -> list[tuple[str, list[str]]]:
    """What :func:`run` still has to do for (arm, seed), as ``(stage, command)`` pairs: the SFT stage (start,
    resume, or redo it where the evaluated SFT run's weights are not in this checkout), then GRPO (start or
    resume); nothing for a finished run. A started folder made with other settings ends the program."""
    over = overrides(arm, seed, extra)
    sft, grpo = sft_dir(arm, seed, root), run_dir(arm, seed, root)
    if RunFolder(grpo).summary.is_file():
        return []
    _refuse_other_config(sft, [*over, f"run.dir={sft}"])
    _refuse_other_config(grpo, [*over, f"run.dir={grpo}"])
    out = []
    if not RunFolder(sft).evaluation("eval-heldout").is_file() or not (sft / SFT_WEIGHTS).is_file():
        if RunFolder(sft).config.is_file():
            out.append(("sft", slea("align", "--resume", str(sft))))
        else:
            out.append(
                ("sft", slea("align", str(CONFIG), "--method", "sft", *_sets([*over, f"run.dir={sft}"])))
            )
    if RunFolder(grpo).config.is_file():
        out.append(("grpo", slea("train", "--resume", str(grpo))))
    else:
        out.append(
            ("grpo", slea("train", str(CONFIG), *_sets([*over, f"model.init_from={sft}", f"run.dir={grpo}"])))
        )
    return out


def run(
    arm: str,
    seed: int,
    extra: list[str] | None = None,
    root: Path | None = None,
    execute: Callable[..., Any] = subprocess.run,
) -> None:
    """Both stages of (arm, seed) that are not done (:func:`commands`), each timed into the run folder's
    ``timing.json``."""
    root = root or RESULTS
    todo = commands(arm, seed, extra, root)
    sft, grpo = sft_dir(arm, seed, root), run_dir(arm, seed, root)
    if not todo:
        print(f"{grpo}: finished, reused")
    for stage, cmd in todo:
        if stage == "sft" and RunFolder(sft).sft.is_file() and not (sft / SFT_WEIGHTS).is_file():
            # evaluated, but its weights are not in this checkout: the SFT stage is trained again
            RunFolder(sft).sft.unlink()
        print("$ slea " + " ".join(cmd[3:]), flush=True)
        t0 = time.perf_counter()
        execute(cmd, check=True)
        grpo.mkdir(parents=True, exist_ok=True)
        f = grpo / "timing.json"
        timing = json.loads(f.read_text()) if f.is_file() else {}
        timing[f"{stage}_s"] = round(timing.get(f"{stage}_s", 0.0) + time.perf_counter() - t0, 1)
        f.write_text(json.dumps(timing, indent=2) + "\n")
    compare.relativize(root)  # committed results name no machine's folder


# -- the table -------------------------------------------------------------------------------------------------
def em_f1(result: dict[str, Any] | None) -> tuple[float | None, float | None]:
    """EM and F1 (%) of an evaluation result (``eval/summary.json``'s ``after``, ``eval-heldout.json``)."""
    row = (((result or {}).get("table") or {}).get("rows") or [{}])[0].get("values") or {}
    em = row.get("Avg EM", next((v for k, v in row.items() if k.endswith(" EM")), None))
    f1 = row.get("Avg F1", next((v for k, v in row.items() if k.endswith(" F1")), None))
    return em, f1


def _games(result: dict[str, Any] | None) -> list[float] | None:
    """Each held-out question's exact answer (0 or 100): the EM of that question."""
    games = stats.per_game_success(result)
    return None if games is None else [100.0 * g for g in games]


def _json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def seen_in_training(games: int, answerable: str = "answer", env_id: str = ARMS[BASELINE]) -> list[bool]:
    """For each held-out game (env seed ``g``, as the evaluation plays it), whether its question's text is also
    a training question's. Search-QA splits FanOutQA by question group, and a few single-hop sub-questions ("What
    is the capital of China?") occur in groups of both splits, so a policy can answer those from memory."""
    from slea.envs import make

    train = make(env_id, split="train", answerable=answerable)
    asked = {it.question.strip() for it in train.unwrapped.items}
    heldout = make(env_id, split="heldout", answerable=answerable)
    return [heldout.reset(seed=g)[1]["goal"].strip() in asked for g in range(games)]


def _novel(games: list[float] | None, seen: list[bool] | None) -> list[float] | None:
    """The per-question EM of the held-out questions not asked in training (:func:`seen_in_training`)."""
    if games is None or seen is None or len(seen) != len(games):
        return None
    return [x for x, s in zip(games, seen) if not s]


def load(r: compare.SubRun, root: Path, seen: list[bool] | None = None) -> dict[str, Any]:
    """One finished run's numbers: held-out EM / F1 / invalid-step rate / episode length after GRPO, the EM on
    the held-out questions not asked in training (``seen``: :func:`seen_in_training`), EM and F1 after SFT alone,
    the final train success and invalid rate, the per-question EM (for the paired CI), seconds."""
    after = (_json(RunFolder(r.dir).summary) or {}).get("after") or {}
    sft = _json(RunFolder(sft_dir(r.algorithm, r.seed, root)).evaluation("eval-heldout"))
    sampled = after.get("sampled") or {}
    em, f1 = em_f1(after)
    sft_em, sft_f1 = em_f1(sft)
    rows = (
        [json.loads(x) for x in RunFolder(r.dir).metrics.read_text().splitlines() if x.strip()]
        if RunFolder(r.dir).metrics.is_file()
        else []
    )
    timing = _json(r.dir / "timing.json") or {}
    wall = sum(timing.values()) if timing else None
    games = _games(after)
    novel = _novel(games, seen)
    return {
        "em": em,
        "f1": f1,
        "games": games,
        "novel_em": float(np.mean(novel)) if novel else None,
        "novel_games": novel,
        "exact": sum(after.get("per_game_wins") or []) or 0,
        "questions": after.get("games"),
        "invalid_rate": sampled.get("invalid_rate"),
        "episode_len": sampled.get("episode_len"),
        "sft_em": sft_em,
        "sft_f1": sft_f1,
        "sft_games": _games(sft),
        "train_success": rows[-1].get("train/success") if rows else None,
        "train_invalid_rate": rows[-1].get("train/invalid_rate") if rows else None,
        "train_invalid_by_iteration": [r.get("train/invalid_rate") for r in rows],
        "train_success_by_iteration": [r.get("train/success") for r in rows],
        "wall_s": wall,
        "timing": timing,
    }


METRICS = (
    ("em", "held-out EM"),
    ("novel_em", "held-out EM, questions not asked in training"),
    ("f1", "held-out F1"),
    ("invalid_rate", "held-out invalid-step rate"),
    ("episode_len", "held-out episode length"),
    ("sft_em", "held-out EM after SFT only"),
)


def comparisons(
    loaded: dict[tuple[str, int], dict[str, Any]], a: str = "tools", b: str = BASELINE
) -> list[stats.PairedComparison]:
    """``a − b`` paired by seed on each of :data:`METRICS`: the per-seed differences, the exact sign-flip p and
    the bootstrap CI (over seeds and then the held-out questions for EM, where both runs hold each question's
    result; over seeds for the rest)."""
    out = []
    for key, label in METRICS:
        va = {s: d[key] for (arm, s), d in loaded.items() if arm == a}
        vb = {s: d[key] for (arm, s), d in loaded.items() if arm == b}
        games = {"em": "games", "novel_em": "novel_games", "sft_em": "sft_games"}.get(key)
        ga = {s: d[games] for (arm, s), d in loaded.items() if arm == a} if games else None
        gb = {s: d[games] for (arm, s), d in loaded.items() if arm == b} if games else None
        c = stats.paired_comparison(va, vb, a_games=ga, b_games=gb, names=(a, b), metric=label)
        if c.n:
            out.append(c)
    return out


def grpo_gains(loaded: dict[tuple[str, int], dict[str, Any]]) -> list[stats.PairedComparison]:
    """Per arm, held-out EM after GRPO − after SFT alone: both stages' policies play the same held-out questions
    greedily, so the comparison pairs by seed and, within a seed, question by question. The per-seed
    differences, the exact sign-flip p over seeds and the two-level bootstrap CI, resampling seeds and then each
    drawn seed's questions (:func:`slea.evaluation.stats.hierarchical_bootstrap_ci`, through
    :func:`slea.evaluation.stats.paired_comparison`)."""
    out = []
    for arm in dict.fromkeys(a for a, _ in loaded):
        mine = {s: d for (a, s), d in loaded.items() if a == arm}
        c = stats.paired_comparison(
            {s: d["em"] for s, d in mine.items()},
            {s: d["sft_em"] for s, d in mine.items()},
            a_games={s: d["games"] for s, d in mine.items()},
            b_games={s: d["sft_games"] for s, d in mine.items()},
            names=(f"{arm}: after GRPO", "after SFT"),
            metric="held-out EM",
        )
        if c.n:
            out.append(c)
    return out


# the tables' note: stats.TABLE_NOTE, with the per-question level of this study's interval named
CI_NOTE = (
    "Paired by seed, and within a seed by held-out question. p: two-sided exact sign-flip test over seeds (all 2^n "
    "sign assignments; with n seeds it cannot go below 2/2^n). 95% CI: percentile bootstrap of the mean difference, "
    "10,000 resamples of the seeds and then of each drawn seed's questions (\"seeds, games\"), or of the seeds only "
    "(\"seeds\"), where the runs hold no per-question score; the seed-only interval never leaves the range of the "
    "per-seed differences, and with 3 seeds either is too narrow, so the verdict goes by p: \"separated\" only at "
    "p < 0.05."
)


def _ms(xs: list[Any], digits: int = 1) -> str:
    v = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    if not v:
        return "–"
    return f"{np.mean(v):.{digits}f} ± {np.std(v, ddof=1):.{digits}f}" if len(v) > 1 else f"{v[0]:.{digits}f}"


def _span(xs: list[Any], digits: int) -> str:
    v = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    return f"{min(v):.{digits}f}-{max(v):.{digits}f}" if v else "–"


def _ranges(loaded: dict[tuple[str, int], dict[str, Any]]) -> str:
    """One line: per arm, the lowest and highest train invalid-step rate and train success over every GRPO
    iteration of every seed, and each run's wall time (SFT + GRPO)."""
    arms = list(dict.fromkeys(a for a, _ in loaded))

    def per_arm(key: str, digits: int, scale: float = 1.0) -> str:
        values = {
            arm: [x / scale for (a, _), d in loaded.items() if a == arm for x in _list(d[key]) if x is not None]
            for arm in arms
        }
        return ", ".join(f"{arm} {_span(v, digits)}" for arm, v in values.items())

    return (
        "Over the GRPO iterations, lowest-highest over every iteration of every seed (training split, sampled): "
        f"invalid-step rate {per_arm('train_invalid_by_iteration', 3)}; train success "
        f"{per_arm('train_success_by_iteration', 3)}. Wall per run (min, SFT + GRPO): {per_arm('wall_s', 1, 60.0)}."
    )


def _list(x: Any) -> list[Any]:
    return [] if x is None else x if isinstance(x, list) else [x]


def _settings(runs: list[compare.SubRun], root: Path) -> str:
    import yaml

    r = next((r for r in runs if RunFolder(r.dir).config.is_file()), None)
    if r is None:
        return ""
    c = yaml.safe_load(RunFolder(r.dir).config.read_text())
    ro, tr, ev = c.get("rollout", {}), c.get("train", {}), c.get("eval", {})
    decoding = "greedy" if ev.get("temperature") == 0 else f"T = {ev.get('temperature')}"
    sft_config = RunFolder(sft_dir(r.algorithm, r.seed, root)).config
    al = yaml.safe_load(sft_config.read_text()).get("align", {}) if sft_config.is_file() else {}
    sft = (
        f"SFT on the expert's {al.get('expert_episodes')} training questions for {al.get('sft_epochs')} epochs, "
        if al
        else ""
    )
    return (
        f"Settings (the first run's SFT and GRPO config.yaml): {sft}env.kwargs {c.get('env', {}).get('kwargs')}, "
        f"rollout.max_new_tokens {ro.get('max_new_tokens')}, GRPO {tr.get('iterations')} iterations x "
        f"{ro.get('groups')} groups x {ro.get('group_size')} episodes, env.max_steps "
        f"{c.get('env', {}).get('max_steps')}; held-out: {ev.get('games')} questions x "
        f"{ev.get('episodes_per_game')} episode, {decoding}."
    )


def table(root: Path | None = None, seen: list[bool] | None = None) -> dict[str, Any]:
    """``RESULTS/table.md`` and ``table.json`` from the finished runs under ``root`` (arms read from the run
    folders' names); ``seen``: :func:`seen_in_training` of the held-out games (computed when not given).
    SystemExit when none has finished."""
    root = root or RESULTS
    runs = compare.finished_runs(root, tuple(ARMS))
    if not runs:
        raise SystemExit(f"no finished run under {root / 'runs'}")
    if seen is None:
        games = (_json(RunFolder(runs[0].dir).summary) or {}).get("after", {}).get("games")
        seen = seen_in_training(int(games)) if games else None
    loaded = {(r.algorithm, r.seed): load(r, root, seen) for r in runs}
    arms = list(dict.fromkeys(r.algorithm for r in runs))
    pairs = comparisons(loaded) if {"tools", BASELINE} <= set(arms) else []
    gains = grpo_gains(loaded)
    tab: dict[str, Any] = {
        "config": "configs/align_searchqa.yaml",
        "common": list(COMMON),
        "arms": {},
        "pairs": [c.to_dict() for c in pairs],
        "grpo_gains": [c.to_dict() for c in gains],
        "heldout_seen_in_training": seen,
    }
    settings = _settings(runs, root)
    lines = [
        "**Search-QA (answerable questions): tags against tools, SFT then GRPO**",
        "",
        *([settings, ""] if settings else []),
        (
            "| arm | env | seeds | held-out EM | held-out F1 | exact answers per seed | held-out invalid-step rate "
            "| held-out episode length | EM after SFT only | held-out EM, questions not asked in training "
            "| final train success | wall (min, SFT + GRPO) |"
        ),
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for arm in arms:
        mine = sorted((r for r in runs if r.algorithm == arm), key=lambda r: r.seed)
        ds = [loaded[(arm, r.seed)] for r in mine]
        per = ", ".join(f"s{r.seed} {d['exact']}/{d['questions']}" for r, d in zip(mine, ds))
        wall = [d["wall_s"] / 60 if d["wall_s"] else None for d in ds]
        tab["arms"][arm] = {
            "env": ARMS.get(arm),
            "seeds": [r.seed for r in mine],
            **{
                k: compare.stat([d[k] for d in ds])
                for k in (
                    "em",
                    "f1",
                    "invalid_rate",
                    "episode_len",
                    "sft_em",
                    "sft_f1",
                    "novel_em",
                    "train_success",
                    "train_invalid_rate",
                    "wall_s",
                )
            },
            "per_seed": {
                str(r.seed): {k: v for k, v in d.items() if k not in ("games", "sft_games", "novel_games")}
                for r, d in zip(mine, ds)
            },
        }
        lines.append(
            f"| {arm} | `{ARMS.get(arm, '?')}` | {len(mine)} | {_ms([d['em'] for d in ds])} | "
            f"{_ms([d['f1'] for d in ds])} | {per} | {_ms([d['invalid_rate'] for d in ds], 3)} | "
            f"{_ms([d['episode_len'] for d in ds], 2)} | {_ms([d['sft_em'] for d in ds])} | "
            f"{_ms([d['novel_em'] for d in ds])} | "
            f"{_ms([d['train_success'] for d in ds], 3)} | {_ms(wall)} |"
        )
    lines += ["", "EM and F1 in %, mean ± std over seeds (sample std; one seed: the value).", "", _ranges(loaded)]
    if seen:
        lines += [
            "",
            (
                f"{sum(seen)} of the {len(seen)} held-out questions are also asked in the training split (the "
                f"split is by FanOutQA question group, and a few sub-questions occur in groups of both): "
                f"\"questions not asked in training\" scores the other {len(seen) - sum(seen)}."
            ),
        ]
    if pairs:
        n = max(c.n for c in pairs)
        lines += [
            "",
            "tools − tags, paired by seed (EM, F1 in points):",
            "",
            stats.markdown_table(pairs, digits=2, note=False).rstrip(),
        ]
        if n < SEEDS_TO_CLAIM:
            lines += [
                "",
                (
                    f"{n} seeds: the smallest reachable p is {stats.format_p(stats.min_sign_flip_pvalue(n))}, "
                    f"so the arms are not separated whatever the data; a claim that one beats the other needs "
                    f"the {SEEDS_TO_CLAIM}-seed standard."
                ),
            ]
    if gains:
        lines += [
            "",
            "What GRPO added to each arm's SFT policy: held-out EM after GRPO − after SFT alone (points):",
            "",
            stats.markdown_table(gains, digits=2, note=False).rstrip(),
        ]
    if pairs or gains:
        lines += ["", CI_NOTE]
    md = "\n".join(lines) + "\n"
    (root / "table.json").write_text(json.dumps(tab, indent=2) + "\n")
    (root / "table.md").write_text(md)
    print(md)
    return tab


# -- the pilots (training split only) ----------------------------------------------------------------------------
def _sft_policy(arm: str, seed: int, sft: Path, extra: list[str] | None = None) -> Path:
    """The SFT policy of (arm, seed) in ``sft``, trained as in the study (with ``extra`` settings) when its
    weights are missing."""
    if not (sft / SFT_WEIGHTS).is_file():
        subprocess.run(slea("align", str(CONFIG), "--method", "sft",
                            *_sets([*overrides(arm, seed, extra), f"run.dir={sft}"])), check=True)
    return sft


def _play_train(sft: Path, out: Path, games: int, episodes: int, temperature: float) -> dict[str, Any]:
    """``sft``'s policy on ``games`` training questions, ``episodes`` sampled episodes each at ``temperature``,
    saved in ``out/eval/eval-train.json`` (a condition already measured is reused, not played again)."""
    from slea.cli.play import eval_

    saved = RunFolder(out).evaluation("eval-train")
    if not saved.is_file():
        eval_(str(sft), split="train", episodes=episodes, seed=None, env=None, out=out, checkpoint=None,
              set_=[f"eval.games={games}", f"eval.temperature={temperature}", "eval.greedy=false"])
    res = json.loads(saved.read_text())
    return {**{k: res["sampled"][k] for k in ("success", "invalid_rate", "episode_len", "episodes")},
            "per_game_wins": res["per_game_wins"], "wall_s": round(res["wall_s"], 1)}


# -- the pilot that chose the second run's tool protocol ------------------------------------------------------------
# (parser rule, stop at the end of a call): the first run's protocol, then the candidates
PILOT = {"first_run": (False, False), "parse": (True, False), "parse_stop": (True, True)}


def _first_run_parse(parser: Any, text: Any, parse: Callable[..., Any] | None = None
                     ) -> tuple[list[dict[str, Any]], str]:
    """The first run's ``hermes`` rule: a last block left open whose JSON is not whole refuses the whole answer,
    even after complete calls (today's rule, ``parse``, drops it: :class:`slea.policy.tool_calls.HermesParser`)."""
    from slea.policy.tool_calls import MAX_TEXT, HermesParser

    calls, why = (parse or HermesParser.parse)(parser, text)
    if calls and len(calls) < len(parser._BLOCK.findall(text[:MAX_TEXT])):
        return [], "the last tool call is cut off"
    return calls, why


def pilot(seed: int = 100, games: int = 16, episodes: int = 4, root: Path | None = None) -> dict[str, Any]:
    """The measurement that chose the second run's protocol, on the training split only: the tools arm's SFT
    policy of a seed outside the study's (``seed``; trained here when its weights are missing) plays ``games``
    training questions ``episodes`` times each at T = 1 (the GRPO rollouts' temperature) under each :data:`PILOT`
    condition; the invalid-step rate and success of each go to ``RESULTS/pilot/pilot.json``."""
    import dataclasses
    from unittest import mock

    from slea.envs.search_qa_tools import SearchQAToolsEnv
    from slea.policy.tool_calls import HermesParser

    root = (root or RESULTS) / "pilot"
    sft = _sft_policy("tools", seed, root / f"sft-tools-s{seed}")
    out: dict[str, Any] = {"sft": sft.name, "split": "train", "games": games, "episodes_per_game": episodes,
                           "temperature": 1.0, "conditions": {}}
    today = HermesParser.parse
    for name, (rule, stop) in PILOT.items():
        inst = dataclasses.replace(SearchQAToolsEnv.instructions, one_call_per_turn=stop)
        with mock.patch.object(SearchQAToolsEnv, "instructions", inst), mock.patch.object(
                HermesParser, "parse", today if rule else lambda p, t: _first_run_parse(p, t, today)):
            res = _play_train(sft, root / name, games, episodes, temperature=1.0)
        res.pop("per_game_wins")
        out["conditions"][name] = {"parse_rule": "today" if rule else "first run", "stop_at_call_end": stop,
                                   **res}
        print(name, out["conditions"][name], flush=True)
    (root / "pilot.json").write_text(json.dumps(out, indent=2) + "\n")
    compare.relativize(root.parent)
    return out


# -- the pilot that chooses the third run's settings (training split only) --------------------------------------
# (c) more SFT: the expert on 64 training questions (of 71) for 6 epochs, against 32 for 3; (d) a lower sampling
# temperature for the GRPO rollouts. Each is a setting of both arms; "today" is the first two runs' settings.
SFT_MORE = ("align.expert_episodes=64", "align.sft_epochs=6")
SETTINGS = {"today": ((), 1.0), "t0.7": ((), 0.7), "more_sft": (SFT_MORE, 1.0), "more_sft_t0.7": (SFT_MORE, 0.7)}


def mixed_groups(per_game_wins: list[int], episodes: int) -> int:
    """The training questions whose ``episodes`` sampled episodes neither all succeed nor all fail: the groups
    whose exact answers differ, so that GRPO's group-relative advantage rewards answering (the others give it
    only the invalid-step penalty to learn from)."""
    return sum(0 < w < episodes for w in per_game_wins)


def choose(conditions: dict[str, dict[str, Any]]) -> str:
    """The settings pilot's rule, fixed before it ran: the condition with the most :func:`mixed_groups` in the
    tools arm; ties go to the higher success, then to the lower invalid-step rate, then to the condition listed
    first (today's settings are listed first, so they are kept unless another condition is strictly better)."""
    order = list(conditions)
    return max(order, key=lambda k: (conditions[k]["mixed_groups"], conditions[k]["success"],
                                     -conditions[k]["invalid_rate"], -order.index(k)))


def settings_pilot(arm: str, seed: int = 100, games: int = 16, episodes: int = 4,
                   root: Path | None = None) -> dict[str, Any]:
    """The measurement that chooses the third run's settings, on the training split only: the arm's SFT policy
    of a seed outside the study's (``seed``), trained as in the study under each SFT setting of :data:`SETTINGS`
    (trained here when its weights are missing), plays ``games`` training questions ``episodes`` times each at
    each condition's temperature; per condition the success, invalid-step rate, episode length and
    :func:`mixed_groups` go to ``RESULTS/settings_pilot/<arm>.json``, and for the tools arm :func:`choose`'s
    pick."""
    root = (root or RESULTS) / "settings_pilot"
    out: dict[str, Any] = {"arm": arm, "env": ARMS[arm], "split": "train", "games": games,
                           "episodes_per_game": episodes, "conditions": {}}
    for name, (sft_over, temperature) in SETTINGS.items():
        sft = _sft_policy(arm, seed, root / f"sft{'-more' if sft_over else ''}-{arm}-s{seed}", list(sft_over))
        res = _play_train(sft, root / arm / name, games, episodes, temperature)
        wins = res.pop("per_game_wins")
        out["conditions"][name] = {"sft": list(sft_over), "temperature": temperature, **res,
                                   "mixed_groups": mixed_groups(wins, episodes)}
        print(name, out["conditions"][name], flush=True)
    if arm == "tools":
        out["chosen"] = choose(out["conditions"])
    (root / f"{arm}.json").write_text(json.dumps(out, indent=2) + "\n")
    compare.relativize(root.parent)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--arm", choices=list(ARMS), required=True)
    r.add_argument("--seed", type=int, required=True)
    r.add_argument("--set", dest="extra", action="append", default=[])
    sub.add_parser("table")
    p = sub.add_parser("pilot")
    p.add_argument("--seed", type=int, default=100)
    p.add_argument("--games", type=int, default=16)
    p.add_argument("--episodes", type=int, default=4)
    sp = sub.add_parser("settings-pilot")
    sp.add_argument("--arm", choices=list(ARMS), required=True)
    sp.add_argument("--seed", type=int, default=100)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        run(args.arm, args.seed, args.extra)
    elif args.cmd == "pilot":
        pilot(args.seed, args.games, args.episodes)
    elif args.cmd == "settings-pilot":
        settings_pilot(args.arm, args.seed)
    else:
        table()


if __name__ == "__main__":
    main()
