"""Held-out evaluation of an agent team (the TeamTR trainer's ``eval/before.json`` and ``eval/after.json``).

As slea's single-agent evaluation (:mod:`slea.evaluation.evaluate`): game ``g`` is env seed ``eval.seed + g``,
``eval.episodes_per_game`` sampled episodes each at ``eval.temperature`` and, with ``eval.greedy``, one greedy
episode; every episode samples from its own stream keyed by (the evaluation salt, env seed, copy, turn), so the
evaluations before and after training draw the same random numbers. ``episode_len`` counts agent messages (a
planner + actor move is two).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slea.atomic import atomic_write_text
from slea.envs.factory import eval_env_kwargs, make_pool
from slea.evaluation.evaluate import summarize
from slea.progress import Progress, episodes_note
from slea.rollout.collector import EVAL_SALT

if TYPE_CHECKING:
    from slea.config import RunConfig


def evaluate_team(collector, cfg: RunConfig, team_task: str, path: Path) -> dict[str, Any]:
    """The team playing through ``collector`` (a :class:`slea.team.rollout.TeamCollector`) on ``cfg.eval.games``
    held-out games (the env's ``split: heldout`` plus ``env.eval_kwargs``), written to ``path`` (JSON)."""
    ev = cfg.eval
    t0 = time.perf_counter()
    kwargs = eval_env_kwargs(cfg.env)
    seeds = [ev.seed + g for g in range(ev.games)]
    out: dict[str, Any] = {"env": cfg.env.id, "team_task": team_task, "games": ev.games}
    runs = [("sampled", ev.episodes_per_game, ev.temperature)] + ([("greedy", 1, 0.0)] if ev.greedy else [])
    for key, copies, temperature in runs:
        with make_pool(cfg.env, ev.games, copies, kwargs) as pool, \
                Progress(f"held-out eval ({key})", total=cfg.team.max_turns, unit="turns") as bar:
            episodes, _ = collector.collect(pool, seeds, rng_salt=EVAL_SALT, temperature=temperature,
                                            progress=episodes_note(bar, len(pool)))
        trajs = [e.trajectory for e in episodes]
        out[key] = {**summarize(trajs), "temperature": temperature}
        if key == "sampled":
            out["per_game_wins"] = [sum(t.won for t in trajs if t.group_id == g) for g in range(ev.games)]
    out["wall_s"] = time.perf_counter() - t0
    atomic_write_text(path, json.dumps(out, indent=2))
    return out
