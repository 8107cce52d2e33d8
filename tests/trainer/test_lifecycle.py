"""The run lifecycle both trainers use (slea/trainer/lifecycle.py), on a fake trainer that records what it is asked:
the order of the phases, checkpoints when due, a budget stop between checkpoints, a stop asked by a signal."""

from __future__ import annotations

import json

import pytest

from slea.config import build_config
from slea.runs.runlog import RunLog
from slea.trainer import lifecycle
from slea.trainer.interrupt import Interrupted
from slea.trainer.run_state import RunState


class FakeRun(lifecycle.Fits):
    """A trainer of ``total`` steps whose step ``k`` logs ``{"k": k}``; ``budget_at`` is the step a rollout budget
    forbids (each step plays one rollout); ``signal_at`` the step during which a signal asks to stop."""

    def __init__(self, tmp_path, *, total=5, save_every=2, budget_at=None, signal_at=None, first=0):
        cfg = build_config({"train": {"save_every": save_every, "iterations": total, "rollout_budget": budget_at}})
        self.dir = tmp_path
        self.state = RunState(cfg, tmp_path, RunLog(tmp_path, loggers=["jsonl"]), total_steps=total, unit="steps",
                              name=lambda k: f"step {k + 1}")
        self.first = first
        self.signal_at = signal_at
        self.calls: list[tuple] = []

    def start(self, resume):
        self.calls.append(("start", resume))
        if not self.first:
            return None, None, -1
        return self.dir / "checkpoints" / f"iter_{self.first:06d}", {}, self.first - 1

    def step(self, k):
        self.calls.append(("step", k))
        self.state.rollouts += 1
        if k == self.signal_at:
            self.state.stop.requested = "SIGINT"
        return {"k": k}

    def steps(self):
        return [c[1] for c in self.calls if c[0] == "step"]

    def save(self, k, state):
        self.calls.append(("save", k))
        return f"iter_{k:06d}"

    def evaluate(self, name):
        self.calls.append((name,))
        return {"sampled": {"success": float(name == "after"), "invalid_rate": 0.0}, "wall_s": 0.0}

    def summary(self):
        self.calls.append(("summary",))
        return {"own": 1, "precision": {"training": "float32"}, "device": "cpu"}

    def close(self):
        self.calls.append(("close",))
        self.state.log.close()


def test_the_phases_run_in_order_and_every_due_step_is_checkpointed(tmp_path):
    run = FakeRun(tmp_path, total=5, save_every=2)
    summary = lifecycle.fit(run, resume=True)
    assert run.calls[:2] == [("start", True), ("before",)]
    assert [c for c in run.calls if c[0] in ("step", "save")] == [
        ("step", 0), ("step", 1), ("save", 1), ("step", 2), ("step", 3), ("save", 3), ("step", 4), ("save", 4)]
    assert run.calls[-3:] == [("after",), ("summary",), ("close",)]
    assert (tmp_path / "config.yaml").is_file()
    assert [json.loads(r)["k"] for r in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3, 4]
    assert summary["own"] == 1 and summary["checkpoint"] == "iter_000004" and summary["after"]["sampled"]
    assert list(summary)[-2:] == ["precision", "device"] and summary["precision"] == {"training": "float32"}
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
    assert run.calls[-1] == ("close",) and ("after",) not in run.calls
    assert (tmp_path / "curves.png").is_file()  # drawn from the rows so far


def test_a_signal_during_the_evaluation_before_stops_before_any_step(tmp_path):
    run = FakeRun(tmp_path, total=3, first=1)
    run.state.stop.requested = "SIGTERM"
    with pytest.raises(Interrupted, match="stopped after step 1"):  # the resumed run's checkpointed step
        lifecycle.fit(run, resume=True)
    assert run.steps() == [] and run.calls[-1] == ("close",) and ("before",) not in run.calls


def test_a_new_run_is_refused_a_folder_that_holds_a_run_and_overwrite_clears_only_a_run_folder(tmp_path,
                                                                                                 monkeypatch):
    """fresh_run_dir: none yet or empty is used; one holding anything is refused, naming --resume and
    --overwrite; --overwrite clears a run folder and nothing else (a link, a folder without a run's files, one
    holding the working folder or a git checkout)."""
    monkeypatch.chdir(tmp_path)
    lifecycle.fresh_run_dir(tmp_path / "none-yet")  # nothing is created here: the trainer makes it
    assert not (tmp_path / "none-yet").exists()
    (tmp_path / "empty").mkdir()
    lifecycle.fresh_run_dir(tmp_path / "empty")
    run = tmp_path / "runs" / "smoke"
    (run / "checkpoints" / "iter_000001").mkdir(parents=True)
    (run / "config.yaml").write_text("run: {}\n")
    (run / "metrics.jsonl").write_text('{"iteration": 0}\n')
    with pytest.raises(lifecycle.RunDirError) as exc:
        lifecycle.fresh_run_dir(run)
    assert "already holds a run" in str(exc.value) and f"--resume {run}" in str(exc.value)
    assert "--overwrite" in str(exc.value) and (run / "metrics.jsonl").is_file()  # nothing was touched
    lifecycle.fresh_run_dir(run, overwrite=True)
    assert not run.exists() and list((tmp_path / "runs").iterdir()) == []  # no hidden leftover beside it

    mine = tmp_path / "notes"  # not a run folder: --overwrite never deletes it
    mine.mkdir()
    (mine / "todo.txt").write_text("keep me")
    with pytest.raises(lifecycle.RunDirError, match="does not look like a slea run folder"):
        lifecycle.fresh_run_dir(mine, overwrite=True)
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "config.yaml").write_text("x: 1\n")
    with pytest.raises(lifecycle.RunDirError, match="does not look like a slea run folder"):
        lifecycle.fresh_run_dir(repo, overwrite=True)
    (tmp_path / "config.yaml").write_text("x: 1\n")  # the working folder itself
    with pytest.raises(lifecycle.RunDirError, match="holds the working folder"):
        lifecycle.fresh_run_dir(tmp_path, overwrite=True)
    with pytest.raises(lifecycle.RunDirError, match="holds the working folder"):
        lifecycle.fresh_run_dir(tmp_path.parent / tmp_path.name, overwrite=True)
    other = tmp_path / "other-run"
    other.mkdir()
    (other / "config.yaml").write_text("run: {}\n")
    (tmp_path / "link").symlink_to(other)
    with pytest.raises(lifecycle.RunDirError, match="is a link"):
        lifecycle.fresh_run_dir(tmp_path / "link", overwrite=True)
    assert (mine / "todo.txt").read_text() == "keep me" and (repo / ".git").is_dir()
    assert (other / "config.yaml").is_file() and (tmp_path / "config.yaml").is_file()


def test_a_second_signal_after_the_step_is_checkpointed_abandons_nothing_and_says_so(tmp_path):
    """Before, a second Ctrl-C that came once the step was checkpointed printed "iteration 6/60 abandoned (nothing
    of it is kept)" and then "last checkpoint: iteration 6/60 (iter_000005)": the step had been kept, and the
    folder was numbered from 0. Now the step is said as stopped after, and its folder counts as the logs do."""
    from slea.cli.runs import interrupted_lines

    def kept(run):
        def save(k, state):
            run.calls.append(("save", k))
            return f"iter_{k + 1:06d}"
        return save

    run = FakeRun(tmp_path / "after", total=6, save_every=4, signal_at=2)
    run.save = kept(run)

    def second_signal(k):  # the second Ctrl-C lands after step 3's checkpoint, while the stop is prepared
        raise KeyboardInterrupt

    run.state.interrupted = second_signal
    with pytest.raises(KeyboardInterrupt):
        lifecycle.fit(run)
    assert run.calls[-2:] == [("save", 2), ("close",)]
    assert interrupted_lines(run) == [
        "Ctrl-C: stopped after step 3", f"last checkpoint: step 3 ({run.dir / 'checkpoints' / 'iter_000003'})",
        f"resume with: slea train --resume {run.dir}"]

    run = FakeRun(tmp_path / "during", total=6, save_every=4, signal_at=2)  # the second one during the step
    run.save = kept(run)
    step = run.step

    def interrupted_step(k):
        row = step(k)
        if k == 2:
            raise KeyboardInterrupt
        return row

    run.step = interrupted_step
    with pytest.raises(KeyboardInterrupt):
        lifecycle.fit(run)
    assert interrupted_lines(run)[:2] == ["Ctrl-C: step 3 abandoned (nothing of it is kept)",
                                          "no checkpoint yet: resuming starts the run from its beginning"]
