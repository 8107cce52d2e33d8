"""metrics.jsonl reading and TensorBoard absence: no silent fallbacks."""

from __future__ import annotations

import builtins
import json
import logging

from slea.runs import loggers
from slea.runs.runlog import RunLog, env_step_curve, read_metrics, truncate_metrics


def _write_rows(path, lines):
    path.write_text("".join(line + "\n" for line in lines))


def test_malformed_metrics_line_is_skipped_and_reported_not_truncating(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    _write_rows(path, [json.dumps({"iteration": 0}), '{"iteration": 1, "x', "[1, 2]",
                       json.dumps({"iteration": 2}), json.dumps({"iteration": 3})])
    with caplog.at_level(logging.WARNING, logger="slea.runs.runlog"):
        assert [r["iteration"] for r in read_metrics(path)] == [0, 2, 3]
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"{path}:2" in m for m in messages) and any(f"{path}:3" in m for m in messages)


def test_resume_truncation_keeps_rows_after_a_malformed_line(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    _write_rows(path, [json.dumps({"iteration": 0}), "garbage", json.dumps({"iteration": 1}),
                       json.dumps({"iteration": 2})])
    with caplog.at_level(logging.WARNING, logger="slea.runs.runlog"):
        truncate_metrics(path, 1)
    assert [r["iteration"] for r in read_metrics(path)] == [0, 1]
    assert any(f"{path}:2" in r.getMessage() for r in caplog.records)


def test_tensorboard_absence_is_warned_once_per_process(tmp_path, monkeypatch, caplog):
    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith("torch.utils.tensorboard"):
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    monkeypatch.setattr(loggers, "_reported", set())
    with caplog.at_level(logging.WARNING, logger="slea.runs.loggers"):
        logs = [RunLog(tmp_path / f"run{i}") for i in range(3)]
    assert all(lg.sinks == [] for lg in logs)
    warnings = [r for r in caplog.records if "tensorboard logger off" in r.getMessage()]
    assert len(warnings) == 1


def test_env_steps_fallback_for_old_runs():
    x, ys = env_step_curve([{"train/episode_len": 2.0, "train/episodes": 4.0, "train/success": 0.5},
                            {"train/episode_len": 3.0, "train/episodes": 4.0, "train/success": 1.0}])
    assert x.tolist() == [8.0, 20.0] and ys["train/success"].tolist() == [0.5, 1.0]
