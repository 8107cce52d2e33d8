"""Held-out evaluation: sampled and greedy episodes on the held-out games, with the same rollout loop.

Reproducible and paired: game ``g`` is played with env seed ``eval.seed + g`` and every episode samples from its
own random stream, keyed by (evaluation, env seed, episode, turn) (:mod:`slea.rollout.collector`), so two
evaluations of the same weights give the same numbers in one process, whatever ran before, and an evaluation
before and after training draws the same random numbers episode by episode.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slea.atomic import atomic_write_text
from slea.envs.factory import make_pool
from slea.evaluation.mechanism import mechanism_metrics
from slea.evaluation.report import new_table
from slea.progress import Progress
from slea.rollout.collector import EVAL_SALT
from slea.runs.folder import RunFolder
from slea.types import Trajectory

if TYPE_CHECKING:
    from slea.config import EnvSection, EvalSection


def summarize(trajs: list[Trajectory]) -> dict[str, float]:
    """Success, mean return, invalid-action rate and mean episode length of a set of episodes, and the
    mechanism's figures (:func:`slea.evaluation.mechanism.mechanism_metrics`: the fraction of decision steps whose
    prompt held retrieved experiences, ``retrieval_hit_rate``, 0 without a library; whether the hits matched the
    step's kind of state and were followed; the Eq.5 step-group size)."""
    n = max(len(trajs), 1)
    steps = sum(len(t.steps) for t in trajs)
    return {
        "success": sum(t.won for t in trajs) / n,
        "return": sum(t.episode_return for t in trajs) / n,
        "invalid_rate": sum(t.invalid_count for t in trajs) / max(steps, 1),
        "episode_len": steps / n,
        "episodes": float(len(trajs)),
        **mechanism_metrics(trajs),
    }


def evaluate(collector, env_cfg: EnvSection, env_kwargs: dict[str, Any], eval_cfg: EvalSection, *, iteration: int = 0,
             label: str = "", keep_trajectories: bool = False) -> dict:
    """Play ``eval_cfg.games`` held-out games: ``episodes_per_game`` sampled episodes at
    ``eval_cfg.temperature`` (each game a group) and, if ``greedy``, one greedy episode per game.

    The result's ``table`` is the env family's paper-style table (:mod:`slea.evaluation.report`) with a row
    for the sampled and one for the greedy episodes (``label`` goes before the row names). With
    ``keep_trajectories`` the trajectories themselves come back under ``trajectories`` (not JSON-able).
    ``env_cfg``: the run's ``env`` section (its id, workers and fault guards, as in training; the pools come from
    :func:`slea.envs.factory.make_pool`); ``env_kwargs`` the held-out split's constructor arguments."""
    t0 = time.perf_counter()
    seeds = [eval_cfg.seed + g for g in range(eval_cfg.games)]
    env_id = env_cfg.id
    out: dict[str, Any] = {"env": env_id, "games": eval_cfg.games}
    with make_pool(env_cfg, eval_cfg.games, eval_cfg.episodes_per_game, env_kwargs) as pool:  # close: JVMs
        trajs = _play(collector, pool, seeds, iteration, eval_cfg.temperature, "held-out eval (sampled)")
    out["sampled"] = summarize(trajs)
    out["sampled"]["temperature"] = eval_cfg.temperature
    out["per_game_wins"] = [sum(t.won for t in trajs if t.group_id == g) for g in range(eval_cfg.games)]
    table = new_table(env_id)
    pre = f"{label} " if label else ""
    table.add(f"{pre}sampled T={eval_cfg.temperature:g}", trajs)
    kept = {"sampled": trajs}
    if eval_cfg.greedy:
        with make_pool(env_cfg, eval_cfg.games, 1, env_kwargs) as gpool:
            gtrajs = _play(collector, gpool, seeds, iteration, 0.0, "held-out eval (greedy)")
        out["greedy"] = summarize(gtrajs)
        table.add(f"{pre}greedy", gtrajs)
        kept["greedy"] = gtrajs
    out["table"] = table.to_dict()
    if keep_trajectories:
        out["trajectories"] = kept
    out["wall_s"] = time.perf_counter() - t0
    return out


def _play(collector, pool, seeds: list[int], iteration: int, temperature: float, name: str) -> list[Trajectory]:
    n = len(pool)
    with Progress(name, total=collector.max_steps, unit="turns") as bar:
        trajs, _ = collector.collect(pool, seeds, iteration=iteration, temperature=temperature, rng_salt=EVAL_SALT,
                                     progress=lambda turn, live: bar.update(turn, f"{n - live}/{n} episodes done"))
    return trajs


def write_eval(run_dir: Path, name: str, result: dict) -> Path:
    folder = RunFolder(run_dir)
    path = atomic_write_text(folder.evaluation(name),
                             json.dumps({k: v for k, v in result.items() if k != "trajectories"}, indent=2))
    if isinstance(result.get("table"), dict) and result["table"].get("markdown"):
        atomic_write_text(folder.evaluation(name, ".md"), result["table"]["markdown"])
    return path
