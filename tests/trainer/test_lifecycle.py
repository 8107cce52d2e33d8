"""The run lifecycle both trainers use (slea/trainer/lifecycle.py), on a fake trainer that records what it is asked:
the order of the phases, checkpoints when due, a budget stop between checkpoints, a stop asked by a signal."""

from __future__ import annotations

import json

import pytest

from slea.config import build_config
from slea.runs.runlog import RunLog
from slea.trainer import lifecycle
from slea.trainer.interrupt import Interrupted, StopSignal


class FakeRun:
    """A trainer of ``total_steps`` steps whose step ``k`` logs ``{"k": k}``; ``budget_at`` is the step a budget
    forbids; ``signal_at`` the step during which a signal asks to stop."""

    unit = "steps"
    main = True
    device = "cpu"

    def __init__(self, tmp_path, *, total=5, save_every=2, budget_at=None, signal_at=None, first=0):
        self.cfg = build_config({"train": {"save_every": save_every, "iterations": total}})
        self.dir = tmp_path
        self.log = RunLog(tmp_path, loggers=["jsonl"])
        self.clock = lifecycle.WallClock()
        self.stop = StopSignal()
        self.last_checkpoint = None
        self.first_step, self.total_steps = first, total
        self.budget_at, self.signal_at = budget_at, signal_at
        self.calls: list[tuple] = []

    def resume(self):
        self.calls.append(("resume",))
        return False

    def begin(self):
        self.calls.append(("begin",))

    def evaluate_before(self):
        self.calls.append(("before",))
        return {"sampled": {"success": 0.0, "invalid_rate": 0.0}, "wall_s": 0.0}

    def budget_stop(self):
        return "a budget" if self.budget_at is not None and len(self.steps()) == self.budget_at else ""

    def step_name(self, k):
        return f"step {k + 1}"

    def step(self, k):
        self.calls.append(("step", k))
        if k == self.signal_at:
            self.stop.requested = "SIGINT"
        return {"k": k}

    def steps(self):
        return [c[1] for c in self.calls if c[0] == "step"]

    def report(self, k, row):
        self.calls.append(("report", k))

    def save(self, k):
        self.calls.append(("save", k))
        self.last_checkpoint = f"iter_{k:06d}"

    def interrupted(self, k):
        return Interrupted(self.stop.requested, self.step_name(k) if k >= 0 else "", self.dir, self.last_checkpoint)

    def evaluate_after(self):
        self.calls.append(("after",))
        return {"sampled": {"success": 1.0, "invalid_rate": 0.0}, "wall_s": 0.0}

    def close_rank(self):
        raise AssertionError("a main process evaluates")

    def finish(self, before, after):
        self.calls.append(("finish",))
        return {"own": 1}, {"training": "float32"}

    def release(self):
        self.calls.append(("release",))
        self.log.close()


def test_the_phases_run_in_order_and_every_due_step_is_checkpointed(tmp_path):
    run = FakeRun(tmp_path, total=5, save_every=2)
    summary = lifecycle.fit(run, resume=True)
    assert run.calls[:3] == [("resume",), ("begin",), ("before",)]
    assert [c for c in run.calls if c[0] in ("step", "save")] == [
        ("step", 0), ("step", 1), ("save", 1), ("step", 2), ("step", 3), ("save", 3), ("step", 4), ("save", 4)]
    assert run.calls[-2:] == [("after",), ("finish",)]
    assert (tmp_path / "config.yaml").is_file()
    assert [json.loads(r)["k"] for r in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3, 4]
    assert summary["own"] == 1 and summary["checkpoint"] == "iter_000004" and summary["after"]["sampled"]
    assert json.loads((tmp_path / "eval" / "summary.json").read_text())["checkpoint"] == "iter_000004"


def test_a_budget_stop_between_checkpoints_checkpoints_the_last_step(tmp_path):
    run = FakeRun(tmp_path, total=6, save_every=2, budget_at=3)
    lifecycle.fit(run)
    assert [c for c in run.calls if c[0] in ("step", "save")] == [
        ("step", 0), ("step", 1), ("save", 1), ("step", 2), ("save", 2)]
    assert ("after",) in run.calls


def test_a_signal_checkpoints_the_step_in_progress_and_stops_before_the_evaluation_after(tmp_path):
    run = FakeRun(tmp_path, total=6, save_every=4, signal_at=2)
    with pytest.raises(Interrupted, match="stopped after step 3"):
        lifecycle.fit(run)
    assert [c for c in run.calls if c[0] in ("step", "save")] == [("step", 0), ("step", 1), ("step", 2), ("save", 2)]
    assert run.calls[-1] == ("release",) and ("after",) not in run.calls


def test_a_signal_during_the_evaluation_before_stops_before_any_step(tmp_path):
    run = FakeRun(tmp_path, total=3, first=1)
    run.evaluate_before = lambda: None
    run.stop.requested = "SIGTERM"
    with pytest.raises(Interrupted, match="stopped after step 1"):  # the resumed run's checkpointed step
        lifecycle.fit(run)
    assert run.steps() == [] and run.calls[-1] == ("release",)
