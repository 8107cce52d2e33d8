"""Generate bench/data/textworld_obs.jsonl.gz: real TextWorld observations for the clustering benchmark.

Plays generated coin_collector / treasure_hunter / cooking games with random admissible actions (seeded) and
records every raw engine observation in stream order as ``{"task_type": ..., "game": ..., "obs": ...}``.
Repeats are kept on purpose: a real rollout stream revisits states. Run:

    PYTHONPATH=src .venv/bin/python bench/data/make_corpus.py [--games 24] [--steps 40]

ScienceWorld observations (``task_type`` ``sw-<task>``) are appended with ``--sw-tasks N`` when the
``scienceworld`` package (and Java) is available; ``--sw-only`` regenerates just those. The committed file was made
with ``--games 42 --episodes 3 --steps 40`` and then ``--sw-only --sw-tasks 16 --steps 40``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import tempfile
from pathlib import Path

OUT = Path(__file__).with_name("textworld_obs.jsonl.gz")


def _games(n: int, seed: int):
    rng = random.Random(seed)
    i = tries = 0
    while i < n and tries < 10 * n:
        tries += 1
        kind = ("coin_collector", "treasure_hunter", "cooking")[i % 3]
        try:
            yield _one(kind, rng)
            i += 1
        except Exception as exc:  # noqa: BLE001 - some seeds cannot host the requested quest: draw another
            print(f"skip {kind}: {type(exc).__name__}", flush=True)


def _one(kind: str, rng: random.Random):
    from textworld import GameOptions
    from textworld.challenges import coin_collector, treasure_hunter
    from textworld.challenges.tw_cooking import cooking

    if True:
        opts = GameOptions()
        opts.seeds = rng.randrange(1 << 30)
        if kind == "coin_collector":
            game = coin_collector.make({"level": rng.choice([5, 10, 20, 30, 50])}, opts)
        elif kind == "treasure_hunter":
            game = treasure_hunter.make({"level": rng.choice([1, 5, 10, 15, 20, 25])}, opts)
        else:
            settings = {"recipe": rng.choice([1, 2, 3]), "take": 1, "go": rng.choice([1, 6, 9]),
                        "open": True, "cook": rng.random() < 0.5, "cut": rng.random() < 0.5,
                        "drop": False, "split": "train", "recipe_seed": rng.randrange(1 << 20)}
            settings["take"] = rng.randint(1, settings["recipe"])
            game = cooking.make(settings, opts)
        return kind, game, opts


def clean(obs: str) -> str:
    """The engine's text as it comes (banner, padding and status line included); slea's env wrapper
    cleans it with ``slea.envs.textworld.clean_observation``, which the benchmark applies."""
    return obs


def textworld_rows(n_games: int, steps: int, episodes: int, seed: int) -> list[dict]:
    import textworld
    import textworld.gym
    from textworld import EnvInfos

    rows: list[dict] = []
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        for gi, (kind, game, opts) in enumerate(_games(n_games, seed)):
            opts.path = str(Path(tmp) / f"g{gi}.z8")
            opts.force_recompile = True
            path = textworld.generator.compile_game(game, opts)
            env_id = textworld.gym.register_game(path, request_infos=EnvInfos(admissible_commands=True),
                                                 max_episode_steps=steps)
            env = textworld.gym.make(env_id)
            for _ep in range(episodes):
                obs, infos = env.reset()
                rows.append({"task_type": kind, "game": gi, "obs": clean(obs)})
                for _t in range(steps):
                    cmds = [c for c in infos["admissible_commands"] if c not in ("look", "inventory")] or ["look"]
                    obs, _r, done, infos = env.step(rng.choice(cmds))
                    rows.append({"task_type": kind, "game": gi, "obs": clean(obs)})
                    if done:
                        break
            env.close()
            print(f"game {gi} {kind}: {len(rows)} rows", flush=True)
    return rows


def scienceworld_rows(n_tasks: int, steps: int, seed: int) -> list[dict]:
    try:
        from scienceworld import ScienceWorldEnv
    except Exception:  # noqa: BLE001 - optional (package or Java missing)
        return []
    rng = random.Random(seed)
    env = ScienceWorldEnv("", envStepLimit=steps)
    rows: list[dict] = []
    tasks = env.get_task_names()
    for task in rng.sample(tasks, min(n_tasks, len(tasks))):
        env.load(task, 0)
        obs, info = env.reset()
        rows.append({"task_type": "sw-" + task, "game": -1, "obs": clean(obs)})
        for _ in range(steps):
            acts = info.get("valid") or env.get_valid_action_object_combinations()
            acts = [a for a in acts if not a.startswith(("inventory", "task", "focus"))] or ["look around"]
            useful = [a for a in acts if a.startswith(("go to", "open", "look at", "pick up", "activate",
                                                       "move", "look around"))]
            obs, _r, done, info = env.step(rng.choice(useful if useful and rng.random() < 0.8 else acts))
            rows.append({"task_type": "sw-" + task, "game": -1, "obs": clean(obs)})
            if done:
                break
    env.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--games", type=int, default=24)
    ap.add_argument("--episodes", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--sw-tasks", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sw-only", action="store_true",
                    help="keep the TextWorld rows of the existing file, regenerate only the ScienceWorld ones")
    a = ap.parse_args()
    if a.sw_only:
        with gzip.open(OUT, "rt", encoding="utf-8") as f:
            rows = [r for r in map(json.loads, f) if not r["task_type"].startswith("sw-")]
    else:
        rows = textworld_rows(a.games, a.steps, a.episodes, a.seed)
    if a.sw_tasks:
        rows += scienceworld_rows(a.sw_tasks, a.steps, a.seed)
    with gzip.open(OUT, "wt", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"{len(rows)} observations -> {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
