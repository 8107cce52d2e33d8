"""The single-agent arm (``textworld_solo_actor``: the team trainer with n = 1) and a team's held-out evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slea.config import load_config
from slea.envs import factory
from slea.team import get_team_task
from slea.team.prompt_builder import TeamPromptBuilder
from slea.trainer.team import TeamTrainer

pytest.importorskip("textworld")

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["train.iterations=1", "rollout.groups=1", "team.max_turns=2", "run.threads=1"]


def test_solo_actor_task_is_the_actor_alone_in_the_same_layout():
    solo, team = get_team_task("textworld_solo_actor"), get_team_task("textworld_planner_actor")
    assert solo.agents == ["actor"] and solo.roles[0].acts and solo.env_ids == team.env_ids
    assert solo.roles[0].cue == team.roles[1].cue  # the same answer cue as the team's actor
    assert "planner" not in solo.roles[0].system and "[planner]" not in solo.roles[0].example[0][0]
    assert "Valid commands:" in solo.roles[0].example[0][0]


def test_solo_arm_trains_one_agent_per_stage_and_evaluates_on_heldout_games(tmp_path, monkeypatch):
    pools = []  # (env kwargs, groups, copies) of every pool the trainer opens
    real_pool = factory.EnvPool

    def recording_pool(env_id, groups, copies, kwargs, **kw):
        pools.append((dict(kwargs), groups, copies))
        return real_pool(env_id, groups, copies, kwargs, **kw)

    # every pool, training's and the held-out evaluation's (slea/evaluation/team.py), comes from make_pool
    monkeypatch.setattr(factory, "EnvPool", recording_pool)
    cfg = load_config(ROOT / "configs/teamtr_smoke.yaml",
                      [*SMALL, "team.task=textworld_solo_actor", "eval.before=true", "eval.greedy=true",
                       "eval.seed=3", "rollout.fuzzy_cutoff=0.75"])  # the strict parser: see the end
    tr = TeamTrainer(cfg, tmp_path / "run")
    assert tr.team.agents == ["actor"] and len(tr.optimizers) == 1
    calls = []
    collect = tr.collector.collect

    def counting(pool, seeds, **kw):
        calls.append((list(seeds), kw.get("rng_salt", 0)))
        return collect(pool, seeds, **kw)

    tr.collector.collect = counting
    summary = tr.fit()
    # training: one pool of the train split; evaluation: sampled (games x episodes_per_game) and greedy pools of
    # the held-out split, before and after
    assert pools[0] == (dict(cfg.env.kwargs), 1, 2)
    held = pools[1:]
    assert [(p[1], p[2]) for p in held] == [(2, 2), (2, 1), (2, 2), (2, 1)]
    assert all(p[0]["split"] == "heldout" for p in held)
    # held-out games are eval.seed + g under the evaluation salt; one stage of one agent = 2 training collections
    evals = [c for c in calls if c[1] == 1]
    assert [c[0] for c in evals] == [[3, 4]] * 4 and len(calls) - len(evals) == 2
    assert summary["updates"] == 1 and summary["agents"] == ["actor"] and summary["episodes"] == 2 * 2
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["role"] for r in rows] == ["actor"] and "team/return_after" in rows[0]
    for name in ("before", "after", "summary"):
        assert (tmp_path / "run" / "eval" / f"{name}.json").is_file()
    saved = json.loads((tmp_path / "run" / "eval" / "summary.json").read_text())
    after = saved["after"]
    assert after["sampled"]["episodes"] == 4 and after["greedy"]["episodes"] == 2
    assert after["sampled"]["temperature"] == 1.0 and after["greedy"]["temperature"] == 0.0
    assert sum(after["per_game_wins"]) == round(after["sampled"]["success"] * 4)
    # with the strict parser (fuzzy_cutoff 0.75, not the preset's loose 0.3) every command of the random tiny model is
    # invalid here (keyed sampling: the same draws every run), so all
    # returns are equal, every advantage 0 and the update skipped: the same weights give the same held-out numbers,
    # episode for episode
    assert rows[0]["teamtr/steps"] == 0
    strip = lambda d: {k: v for k, v in d.items() if k != "wall_s"}
    assert strip(saved["before"]) == strip(after)


def test_solo_prompt_has_no_planner_and_lists_commands():
    from slea.config import ModelSection
    from slea.policy.model import load_policy
    from slea.team import SharedContext

    _, tok = load_policy(ModelSection(name_or_path="tiny", dtype="float32", lora=False))
    ctx = SharedContext()
    ctx.add("env", "You are in a pantry.")
    role = get_team_task("textworld_solo_actor").roles[0]
    text = tok.decode(TeamPromptBuilder(tok).build(role, "take the coin", ctx, ["take coin", "go west"]))
    assert "Team transcript:\n[env] You are in a pantry." in text and "- take coin" in text
    assert "Your command:" in text and "[planner]" not in text
