"""slea/trainer/run_state.py: the run's state a checkpoint keeps (saved, then restored, equal), the time budget over
all of a run's processes, and the guards both trainers apply after a step."""

from __future__ import annotations

import json

import pytest

from slea.config import build_config
from slea.runs.runlog import RunLog
from slea.trainer.guards import RunHalted
from slea.trainer.run_state import RunState


def _state(tmp_path, **train) -> RunState:
    cfg = build_config({"train": {"iterations": 6, **train}})
    return RunState(cfg, tmp_path, RunLog(tmp_path, loggers=["jsonl"]), total_steps=6, unit="iterations",
                    name=lambda k: f"iteration {k + 1}/6")


def test_saved_then_restored_the_state_is_the_same(tmp_path):
    st = _state(tmp_path, max_bad_updates=3)
    st.rollouts, st.env_steps = 12, 40
    st.guard.observe(True)
    st.clock.train_before, st.clock.before = 5.0, 9.0  # an earlier process's seconds
    st.saved(2, "iter_000003")
    kept = json.loads(json.dumps(st.to_state()))  # what state.json holds
    assert set(kept) == {"rollouts", "env_steps", "bad_update_streak", "train_s", "wall_s"}
    assert kept["train_s"] >= 5.0 and kept["wall_s"] >= 9.0 and kept["bad_update_streak"] == 1

    back = _state(tmp_path, max_bad_updates=3)
    back.restore(kept, 2, "iter_000003")
    assert (back.first_step, back.last_checkpoint, back.saved_step) == (3, "iter_000003", "iteration 3/6")
    assert (back.rollouts, back.env_steps, back.guard.streak) == (12, 40, 1)
    assert (back.clock.train_before, back.clock.before) == (kept["train_s"], kept["wall_s"])
    assert back.to_state()["train_s"] >= kept["train_s"]  # and it goes on counting from there


def test_an_older_checkpoint_s_state_counts_its_episodes_as_rollouts_and_no_seconds(tmp_path):
    back = _state(tmp_path)
    back.restore({"episodes": 8, "env_steps": 3}, 0, "iter_000001")
    assert (back.rollouts, back.env_steps, back.guard.streak, back.clock.train_before) == (8, 3, 0, 0.0)


def test_the_time_budget_counts_the_training_seconds_of_earlier_processes(tmp_path):
    st = _state(tmp_path, time_budget_s=100.0)
    st.clock.start_training()
    assert st.budget_stop() == ""  # this process has trained for no time
    st.restore({"train_s": 99.0}, 2, "iter_000003")  # the earlier processes trained 99 s of the 100
    st.last_step_s = 4.0  # the next step is expected to end 1 + 4 s past the budget's 100: more than half a step
    assert st.budget_stop().startswith("time budget of 100s (99s spent)") and st.stopped_by == st.budget_stop()
    st.restore({"train_s": 90.0}, 2, "iter_000003")
    assert st.budget_stop() == ""  # 90 + 2 ≤ 100


def test_the_rollout_and_env_step_budgets_count_the_whole_run(tmp_path):
    st = _state(tmp_path, rollout_budget=10, env_step_budget=50)
    st.restore({"rollouts": 10, "env_steps": 5}, 1, "iter_000002")
    assert st.budget_stop() == "rollout budget of 10 (10 played)"
    st.restore({"rollouts": 4, "env_steps": 50}, 1, "iter_000002")
    assert st.budget_stop() == "env-step budget of 50 (50 played)"


def test_the_guards_stop_after_a_streak_of_bad_updates_or_too_many_env_faults(tmp_path):
    st = _state(tmp_path, max_bad_updates=2)
    st.guard.observe(True)
    st.check_guards(0)  # one bad update: the run goes on
    st.saved(0, "iter_000001")
    st.guard.observe(True)
    with pytest.raises(RunHalted, match=r"^stopped at iteration 2: 2 updates in a row hit NaN/inf .*last good "
                                        r"checkpoint is iter_000001"):
        st.check_guards(1)
    st.guard.observe(False)
    st.note_faults({"calls": 10, "faults": 2, "env_errors": 2}, "boom")
    st.check_guards(2)  # 20% is not more than env.max_fault_rate's default 0.2
    st.note_faults({"calls": 10, "faults": 3, "env_errors": 3}, "boom")
    with pytest.raises(RunHalted, match=r"^stopped at iteration 4: 3 of 10 env calls faulted .*last error: boom"):
        st.check_guards(3)


def test_a_team_s_guard_message_names_its_step(tmp_path):
    cfg = build_config({"train": {"max_bad_updates": 1}})
    st = RunState(cfg, tmp_path, RunLog(tmp_path, loggers=["jsonl"]), total_steps=4, unit="single-agent updates",
                  name=lambda k: f"update {k + 1}")
    st.guard.observe(True)
    with pytest.raises(RunHalted, match=r"^stopped at single-agent update 3: 1 updates in a row"):
        st.check_guards(2)


def test_a_stop_after_the_last_step_says_resume_runs_the_evaluation(tmp_path):
    st = _state(tmp_path)
    st.stop.requested = "SIGTERM"
    assert st.interrupted(5).where == "iteration 6/6 (every iteration done: `--resume` runs the held-out evaluation)"
    assert st.interrupted(-1).where == "" and st.interrupted(2).exit_code == 143
