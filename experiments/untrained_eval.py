"""The untrained embedded model (SmolLM2-135M-Instruct, LoRA off) on every env family, as paper-style tables.

The papers' "prompt" rows (GiGPO's "Qwen2.5 prompt", tlm-DRE's prompt baselines) measure a model before any
training; this is slea's counterpart for the embedded model, on a small CPU budget per family: one sampled
episode (temperature 1.0) and one greedy episode per game, through the same rollout loop and
:func:`slea.evaluation.evaluate.evaluate` that training uses. Writes ``experiments/results/untrained_eval.json`` (every
family's evaluation result, its table included) and ``experiments/results/untrained_eval.md`` (the tables).

    .venv/bin/python experiments/untrained_eval.py [--families alfworld,webshop] [--model embedded]
    .venv/bin/python experiments/untrained_eval.py --smoke     # the tiny model, 1 game, 1 step: checks the wiring

Budget (``--budget full``, the default): ALFWorld generated games, 6 task types x 2 (30 steps); WebShop 12 held-out goals (15 steps);
ScienceWorld 3 tasks x 2 variations, one dev (Seen) and one test (Unseen) each (30 steps); Search-QA 12
held-out FanOutQA sub-questions (4 turns); Sokoban 12 held-out rooms (15 steps); TextWorld 8 held-out games
(8 steps). Families whose extra is missing are reported as skipped. On 2 cores shared with a training job a
turn of 8-12 prompts took 1-2 minutes (ALFWorld's sampled pass alone: 58 minutes), so ``--budget reduced``
(:data:`REDUCED`) and ``--budget minimal`` (:data:`MINIMAL`: greedy only, 4-6 games, 3-6 steps) exist.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

import slea.envs as E
from slea.atomic import atomic_write_text
from slea.config import EnvSection, EvalSection, ModelSection, RolloutSection
from slea.evaluation.evaluate import evaluate
from slea.evaluation.report import PaperTable
from slea.policy.generation import HFGenerator
from slea.policy.model import load_policy
from slea.policy.prompt_builder import PromptBuilder
from slea.rollout.collector import RolloutCollector

OUT = Path(__file__).parent / "results"

# ScienceWorld: three short tasks, each with its first dev (Seen) and first test (Unseen) variation.
SW_TASKS = ("find-living-thing", "lifespan-longest-lived", "chemistry-mix")


def _sw_episodes() -> list[tuple[str, int]]:
    from slea.envs.scienceworld import variations

    return [(t, variations(t, split)[0]) for t in SW_TASKS for split in ("dev", "test")]


# family -> env id, env kwargs, games, max steps, rollout (prompt) settings
FAMILIES: dict[str, dict[str, Any]] = {
    "alfworld": {
        "env": "slea/ALFWorld-Gen-v0", "games": 12, "max_steps": 30,
        "kwargs": {"split": "heldout", "num_games": 12, "expert": None},  # game i: task type i % 6
        "rollout": {"max_new_tokens": 16, "obs_max_chars": 600},
    },
    "webshop": {
        "env": "slea/WebShop-v0", "games": 12, "max_steps": 15,
        "kwargs": {"split": "heldout"},
        "rollout": {"max_new_tokens": 24, "obs_max_chars": 800},
    },
    "scienceworld": {
        "env": "slea/ScienceWorld-v0", "games": 6, "max_steps": 30,
        "kwargs": {"episodes": _sw_episodes, "max_admissible": 40, "walkthrough": False},
        "rollout": {"max_new_tokens": 16, "obs_max_chars": 600},
    },
    "search_qa": {
        "env": "slea/SearchQA-v0", "games": 12, "max_steps": 4,
        "kwargs": {"split": "heldout"},
        "rollout": {"max_new_tokens": 64, "obs_max_chars": 1600},  # multi-line answers: the env's instructions
    },
    "sokoban": {
        "env": "slea/Sokoban-v0", "games": 12, "max_steps": 15,
        "kwargs": {"split": "heldout"},
        "rollout": {"max_new_tokens": 8},
    },
    "textworld": {
        "env": "slea/TextWorld-v0", "games": 8, "max_steps": 8,
        "kwargs": {"split": "heldout", "num_games": 8},
        "rollout": {"max_new_tokens": 12},
    },
}


# ``--budget reduced``: what fits in about 45 minutes on 2 cores shared with a training job (the full budget
# above took 58 minutes for ALFWorld's sampled pass alone there: ~2 minutes per turn of 12 prompts).
REDUCED: dict[str, dict[str, Any]] = {
    "alfworld": {"games": 6, "max_steps": 10, "kwargs": {"num_games": 6}},  # one game per task type
    "webshop": {"games": 6, "max_steps": 10},
    "scienceworld": {"games": 6, "max_steps": 10, "kwargs": {"max_admissible": 20}},
    "search_qa": {"games": 8},
    "sokoban": {"games": 8, "max_steps": 10},
    "textworld": {},
}
# ``--budget minimal``: greedy episodes only, a handful of games and steps (what was left of a session's time).
MINIMAL: dict[str, dict[str, Any]] = {
    "alfworld": {"games": 6, "max_steps": 6, "kwargs": {"num_games": 6}},  # one game per task type
    "webshop": {"games": 6, "max_steps": 6},
    "scienceworld": {"games": 6, "max_steps": 6, "kwargs": {"max_admissible": 20}},
    "search_qa": {"games": 6, "max_steps": 3},
    "sokoban": {"games": 6, "max_steps": 6},
    "textworld": {"games": 4, "max_steps": 4, "kwargs": {"num_games": 4}},
}


def run_family(name: str, spec: dict[str, Any], model, tok, model_cfg: ModelSection, *, smoke: bool,
               label: str, greedy_only: bool = False, episodes: int = 1) -> dict[str, Any]:
    env_spec = E.registered()[spec["env"]]
    missing = env_spec.missing()
    if missing:
        return {"env": spec["env"], "skipped": f"missing {', '.join(missing)} (pip install 'slea[{env_spec.extra}]')"}
    kwargs = {k: (v() if callable(v) else v) for k, v in spec["kwargs"].items()}
    games, max_steps = (1, 1) if smoke else (spec["games"], spec["max_steps"])
    if smoke and "num_games" in kwargs:
        kwargs["num_games"] = 1
    rollout = RolloutSection(**{"temperature": 1.0, **spec["rollout"]})
    builder = PromptBuilder.from_rollout(tok, rollout)
    gen = HFGenerator(model, tok, dtype=model_cfg.dtype)
    collector = RolloutCollector(gen, builder, rollout, max_steps)
    eval_cfg = EvalSection(games=games, episodes_per_game=episodes, temperature=0.0 if greedy_only else 1.0,
                           greedy=not greedy_only, seed=0)
    try:
        res = evaluate(collector, EnvSection(id=spec["env"]), kwargs, eval_cfg, label=label)
    except Exception as exc:  # noqa: BLE001  (one family's failure must not lose the others' tables)
        return {"env": spec["env"], "skipped": f"{type(exc).__name__}: {exc}"}
    if greedy_only:  # the one pass ran at temperature 0: it is the greedy row
        table = PaperTable.from_dict(res["table"])
        table.rows[0].label = f"{label} greedy"
        res["table"], res["greedy"] = table.to_dict(), res["sampled"]
    res["settings"] = {"env_kwargs": kwargs, "max_steps": max_steps, "games": games,
                       "rollout": spec["rollout"], "episodes_per_game": episodes,
                       "passes": ["greedy"] if greedy_only else ["sampled T=1.0", "greedy"]}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated subset")
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="tiny model, 1 game, 1 step (wiring check)")
    ap.add_argument("--budget", choices=("full", "reduced", "minimal"), default="full",
                    help="full: the budgets of the module doc; reduced: REDUCED (a contended 2-core machine)")
    ap.add_argument("--out", type=Path, default=None, help="output stem (default experiments/results/untrained_eval)")
    ap.add_argument("--episodes", type=int, default=1, help="sampled episodes per game (greedy: always one)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model_name = "tiny" if args.smoke else args.model
    model_cfg = ModelSection(name_or_path=model_name, lora=False, dtype="float32" if args.smoke else "bfloat16")
    model, tok = load_policy(model_cfg)
    model.eval()
    label = "SmolLM2-135M untrained" if model_name == "embedded" else f"{model_name} untrained"
    stem = args.out or (OUT / ("untrained_eval_smoke" if args.smoke else "untrained_eval"))
    stem.parent.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"model": model_name, "lora": False, "dtype": model_cfg.dtype, "episodes": args.episodes,
                               "threads": args.threads, "budget": args.budget, "families": {}}
    t0 = time.perf_counter()
    for name in [f.strip() for f in args.families.split(",") if f.strip()]:
        t = time.perf_counter()
        print(f"[{name}] ...", flush=True)
        spec = dict(FAMILIES[name])
        if args.budget != "full":
            red = (REDUCED if args.budget == "reduced" else MINIMAL)[name]
            spec.update({k: v for k, v in red.items() if k != "kwargs"})
            spec["kwargs"] = {**spec["kwargs"], **red.get("kwargs", {})}
        res = run_family(name, spec, model, tok, model_cfg, smoke=args.smoke, label=label,
                         greedy_only=args.budget == "minimal", episodes=args.episodes)
        res["family_wall_s"] = time.perf_counter() - t
        results["families"][name] = res
        if "table" in res:
            print(PaperTable.from_dict(res["table"]).to_markdown(), flush=True)
            s, g = res["sampled"], res.get("greedy", {})
            print(f"  sampled success {s['success']:.3f} invalid {s['invalid_rate']:.3f} len {s['episode_len']:.1f}; "
                  f"greedy success {g.get('success', float('nan')):.3f}; {res['family_wall_s']:.0f}s", flush=True)
        else:
            print(f"  skipped: {res['skipped']}", flush=True)
        results["wall_s"] = time.perf_counter() - t0
        write(stem, results)  # after every family: a crash keeps the tables made so far
    print(f"wrote {stem.with_suffix('.json')} and {stem.with_suffix('.md')} in {results['wall_s'] / 60:.1f} min")


def write(stem: Path, results: dict[str, Any]) -> None:
    atomic_write_text(stem.with_suffix(".json"), json.dumps(results, indent=2, default=str))
    lines = [f"# Untrained {results['model']} (LoRA off): paper-style tables ({results['budget']} budget)", "",
             ("One greedy episode per game" if results["budget"] == "minimal" else
              f"{results.get('episodes', 1)} sampled episode(s) (T=1.0) and one greedy episode per game")
             + "; budgets and prompt settings per family in the JSON (`settings`).", ""]
    for name, res in results["families"].items():
        lines.append(f"## {name} (`{res['env']}`)")
        lines.append("")
        if "table" in res:
            lines.append(PaperTable.from_dict(res["table"]).to_markdown(first="Model / decoding", title=False))
            s, g = res["sampled"], res.get("greedy", {})
            if res["settings"]["passes"] == ["greedy"]:
                lines.append(f"Greedy only: invalid-action rate {100 * g['invalid_rate']:.1f} %, mean episode length "
                             f"{g['episode_len']:.1f}; wall time {res['family_wall_s']:.0f} s.")
            else:
                lines.append(f"Invalid-action rate: sampled {100 * s['invalid_rate']:.1f} %, greedy "
                             f"{100 * g.get('invalid_rate', float('nan')):.1f} %; mean episode length: sampled "
                             f"{s['episode_len']:.1f}, greedy {g.get('episode_len', float('nan')):.1f}; "
                             f"wall time {res['family_wall_s']:.0f} s.")
        else:
            lines.append(f"skipped: {res['skipped']}")
        lines.append("")
    atomic_write_text(stem.with_suffix(".md"), "\n".join(lines))


if __name__ == "__main__":
    main()
