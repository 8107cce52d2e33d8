"""``train.time_budget_s`` / ``rollout_budget`` / ``env_step_budget`` in a team run: checked before every
single-agent update, a stop leaves a finished run (a checkpoint of the last update, the held-out evaluation,
``eval/summary.json``), and a resumed run counts the budget its checkpoint had already spent. The guards
(``train.max_bad_updates``, ``env.max_fault_rate``) stop a team run after an update, before its checkpoint.

The tiny model on the TeamTR smoke preset cut to one task group (2 episodes per collection), 2 stages × 2 agents.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from slea.config import load_config
from slea.runs import checkpoint as ckpt
from slea.runs.runlog import read_metrics
from slea.testing.team_signal import signal_algorithm
from slea.trainer.guards import RunHalted
from slea.trainer.lifecycle import train_step
from slea.trainer.team import TeamTrainer

pytest.importorskip("textworld")

ROOT = Path(__file__).resolve().parents[2]
SIGNAL = "test_team_budget_signal"
OVERRIDES = ["rollout.groups=1", "team.max_turns=2", "team.trust_region.min_steps=1", "team.trust_region.max_steps=1",
             "team.trust_region.kl_estimator=k3", "train.iterations=2", "train.lr=0.001", "train.keep_checkpoints=4",
             "train.save_every=3", "run.threads=1", "eval.games=1", "eval.episodes_per_game=1",
             f"algorithm.name={SIGNAL}"]


@pytest.fixture(scope="module", autouse=True)
def signal():
    with signal_algorithm(SIGNAL):
        yield SIGNAL


def _cfg(*extra: str):
    return load_config(ROOT / "configs/teamtr_smoke.yaml", [*OVERRIDES, *extra])


def _rows(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in read_metrics(run / "metrics.jsonl")]


def _state(run: Path) -> dict:
    return json.loads((ckpt.latest_checkpoint(run / "checkpoints") / "state.json").read_text())


def test_rollout_budget_stops_between_updates_finishes_the_run_and_resumes_within_the_budget(tmp_path):
    run = tmp_path / "run"
    # a collection is 2 episodes: π̂^0 (2) and the team after update 0 (4) spend the budget of 4 mid-stage 0
    summary = TeamTrainer(_cfg("train.rollout_budget=4"), run).fit()
    rows = read_metrics(run / "metrics.jsonl")
    assert [(r["stage"], r["position"]) for r in rows] == [(0, 0)]
    assert [(r["rollouts"], r["episodes"]) for r in rows] == [(4, 4)]
    assert summary["stopped_by"].startswith("rollout budget of 4 (4 played)") and summary["updates"] == 1
    assert summary["episodes"] == 4 and summary["env_steps"] == rows[-1]["env_steps"]
    for name in ("eval/after.json", "eval/summary.json", "curves.png", "adapters/actor.safetensors"):
        assert (run / name).is_file(), name
    # train.save_every=3 would not have saved update 0: the stop checkpoints the evaluated adapters, mid-stage
    assert [p.name for p in ckpt.list_checkpoints(run / "checkpoints")] == ["iter_000001"]
    state = _state(run)
    assert state["pending"] is not None and state["episodes"] == 4 and state["train_s"] > 0
    assert state["env_steps"] == rows[-1]["env_steps"]
    for r in rows:  # the columns `slea compare` reads
        assert {"env_steps", "rollouts", "train/success", "train/return"} <= r.keys()

    # resumed with the same budget: already spent, nothing more is played
    again = TeamTrainer(_cfg("train.rollout_budget=4"), run).fit(resume=True)
    assert again["updates"] == 1 and again["episodes"] == 4 and len(read_metrics(run / "metrics.jsonl")) == 1

    # resumed with a budget of 8: update 1 (6 episodes), then stage 1's π̂^0 and update 2 (10), then the stop;
    # the same rows as a run that had the budget of 8 from the start
    bigger = TeamTrainer(_cfg("train.rollout_budget=8"), run).fit(resume=True)
    ref = tmp_path / "ref"
    TeamTrainer(_cfg("train.rollout_budget=8"), ref).fit()
    assert [(r["stage"], r["position"], r["rollouts"]) for r in _rows(run)] == [(0, 0, 4), (0, 1, 6), (1, 0, 10)]
    assert _rows(run) == _rows(ref)
    assert bigger["episodes"] == 10 and "rollout budget of 8 (10 played)" in bigger["stopped_by"]


def test_env_step_budget_counts_the_acting_agents_moves(tmp_path):
    moves = "rollout.fuzzy_cutoff=0.0"  # the tiny model's text, matched to its closest command, steps the env
    tr = TeamTrainer(_cfg(moves), tmp_path / "count")
    played = []
    collect = tr.collector.collect

    def counting(pool, seeds, **kw):
        episodes, stats = collect(pool, seeds, **kw)
        played.append(sum(1 for e in episodes for s, a in zip(e.trajectory.steps, e.agents)
                          if tr.task.roles[a].acts and s.action))
        return episodes, stats

    tr.collector.collect = counting
    rows = [train_step(tr, k) for k in range(len(tr.task.roles))]  # stage 0
    tr.close()
    # fresh rollouts: π̂^0, then the team after each update; a planner's message steps no env
    assert [r["env_steps"] for r in rows] == [played[0] + played[1], sum(played)]
    # budget/*: what each update's collections added (π̂^0 counts to the first update), as single-agent rows log
    assert [r["budget/env_steps"] for r in rows] == [played[0] + played[1], played[2]]
    assert [r["budget/rollouts"] for r in rows] == [4, 2]
    assert tr.state.env_steps == sum(played) and tr.state.rollouts == 6

    budget = rows[0]["env_steps"]
    assert 0 < budget < sum(played)
    summary = TeamTrainer(_cfg(moves, f"train.env_step_budget={budget}"), tmp_path / "run").fit()
    assert summary["updates"] == 1 and summary["stopped_by"].startswith(f"env-step budget of {budget}")


def test_time_budget_counts_the_seconds_spent_before_a_resume(tmp_path):
    run = tmp_path / "run"
    none = TeamTrainer(_cfg("train.time_budget_s=0.000001"), tmp_path / "none").fit()
    assert none["updates"] == 0 and none["episodes"] == 0 and none["stopped_by"].startswith("time budget")
    assert (tmp_path / "none/eval/after.json").is_file()  # no update: the untrained team is evaluated

    TeamTrainer(_cfg("train.rollout_budget=4"), run).fit()
    spent = _state(run)["train_s"]
    # this process has spent almost nothing, but the checkpoint had spent `spent` seconds: over a budget of 0.9×
    summary = TeamTrainer(_cfg(f"train.time_budget_s={0.9 * spent}"), run).fit(resume=True)
    assert summary["updates"] == 1 and summary["stopped_by"].startswith("time budget")
    summary = TeamTrainer(_cfg("train.time_budget_s=100000"), run).fit(resume=True)
    assert summary["updates"] == 4 and summary["stopped_by"] is None


# -- the guards: a team run applies train.max_bad_updates and env.max_fault_rate as a single-agent run does ------
def test_a_streak_of_bad_updates_stops_a_team_run_before_its_checkpoint(tmp_path):
    run = tmp_path / "run"
    tr = TeamTrainer(_cfg("train.max_bad_updates=2", "train.save_every=1"), run)
    real = tr.loss_fn

    def nan_loss(*args, **kwargs):  # every optimizer step's loss is NaN: the numerical guard skips each one
        loss, metrics = real(*args, **kwargs)
        return loss * float("nan"), metrics

    tr.loss_fn = nan_loss
    before = {k: v.detach().clone() for k, v in tr.weights.items()}
    with pytest.raises(RunHalted, match=r"^stopped at single-agent update 2: 2 updates in a row hit NaN/inf .*"
                                        r"the last good checkpoint is iter_000001"):
        tr.fit()
    tr.close()
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [0, 1] and all(r["teamtr/steps"] >= 1 for r in rows)
    assert [p.name for p in ckpt.list_checkpoints(run / "checkpoints")] == ["iter_000001"]  # update 2's: never
    assert _state(run)["bad_update_streak"] == 1
    assert all(torch.equal(before[k], v) for k, v in tr.weights.items())  # every step skipped: the weights kept


def test_too_many_env_faults_in_an_update_stop_a_team_run(tmp_path):
    tr = TeamTrainer(_cfg("train.save_every=1"), tmp_path / "run")
    tr.pool.take_fault_stats = lambda: {"calls": 10, "faults": 3, "env_errors": 3}
    tr.pool.last_error = "step of env 0: RuntimeError: injected"
    with pytest.raises(RunHalted, match=r"^stopped at single-agent update 1: 3 of 10 env calls faulted \(30% > "
                                        r"env.max_fault_rate=0.2; env_errors 3\); last error: step of env 0"):
        train_step(tr, 0)
    tr.close()
    assert len(read_metrics(tmp_path / "run/metrics.jsonl")) == 1  # the row is logged, no checkpoint follows it
    assert not ckpt.list_checkpoints(tmp_path / "run/checkpoints")
