"""run.loggers: W&B (offline) and MLflow (a file store) receive every metrics row, a resumed run continues the same
W&B / MLflow run, and a logger that cannot start or fails mid-run is one warning line, never a crash."""

from __future__ import annotations

import json
import logging

import pytest

from slea.runs import loggers
from slea.runs.runlog import RunLog, read_metrics

CONFIG = {"algorithm": {"name": "grpo", "clip_eps": 0.2}, "run": {"seed": 0, "loggers": ["jsonl", "wandb"]}}


def _rows(n, start=0):
    return [{"train/success": 0.25 * i, "update/lr": 3e-4, "update/loss": float("nan"), "note": "text"}
            for i in range(start, start + n)]


def test_wandb_offline_gets_every_row_and_a_resumed_run_continues_it(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    run.mkdir()
    lg = RunLog(run, loggers=["jsonl", "wandb"], config=CONFIG)
    assert [s.name for s in lg.sinks] == ["wandb"]
    for i, row in enumerate(_rows(2)):
        lg.log(i, row)
    lg.close()
    run_id = json.loads((run / "loggers.json").read_text())["wandb"]
    offline = list((run / "wandb").glob(f"offline-run-*-{run_id}"))
    assert offline and list(offline[0].glob("run-*.wandb")), "the offline run's history file"
    assert [r["iteration"] for r in read_metrics(run / "metrics.jsonl")] == [0, 1]  # jsonl: always
    lg = RunLog(run, loggers=["jsonl", "wandb"], config=CONFIG)  # resumed: the same W&B run id
    lg.log(2, _rows(1, 2)[0])
    lg.close()
    assert json.loads((run / "loggers.json").read_text())["wandb"] == run_id
    assert len(list((run / "wandb").glob(f"offline-run-*-{run_id}"))) >= 1


def test_mlflow_file_store_gets_params_and_every_metric_at_its_iteration(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    store = tmp_path / "store"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    run = tmp_path / "run"
    run.mkdir()
    lg = RunLog(run, loggers=["jsonl", "mlflow"], project="slea-test", config=CONFIG)
    for i, row in enumerate(_rows(3)):
        lg.log(i, row)
    lg.close()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store.as_uri())
    run_id = json.loads((run / "loggers.json").read_text())["mlflow"]
    got = client.get_run(run_id)
    assert got.info.run_name == "run" and got.info.status == "FINISHED"
    assert got.data.params["algorithm.name"] == "grpo" and got.data.params["algorithm.clip_eps"] == "0.2"
    history = client.get_metric_history(run_id, "train/success")
    assert [(m.step, m.value) for m in history] == [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert "update/loss" not in got.data.metrics and "note" not in got.data.metrics  # NaN and text: no point
    lg = RunLog(run, loggers=["mlflow"], project="slea-test", config=CONFIG)  # resumed: the same MLflow run
    lg.log(3, _rows(1, 3)[0])
    lg.close()
    assert [m.step for m in client.get_metric_history(run_id, "train/success")] == [0, 1, 2, 3]
    assert len(client.search_runs([got.info.experiment_id])) == 1


def test_a_logger_that_cannot_start_or_fails_later_is_one_line_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    pytest.importorskip("wandb")
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9/")  # nothing listens on the discard port
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    with caplog.at_level(logging.WARNING, logger="slea.runs.loggers"):
        lg = RunLog(tmp_path, loggers=["jsonl", "wandb", "mlflow"], config=CONFIG)
    assert lg.sinks == []
    lines = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("wandb logger off: ") and "wandb login" in m for m in lines), lines
    assert any(m.startswith("mlflow logger off: ") for m in lines) or pytest.importorskip("mlflow") is None, lines
    assert all("\n" not in m for m in lines)
    lg.log(0, {"train/success": 1.0})
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"iteration": 0, "train/success": 1.0}]

    class Broken:
        name = "broken"

        def log(self, iteration, metrics):
            raise ConnectionError("the tracking server went away\nsecond line")

    caplog.clear()
    lg.sinks = [Broken()]
    with caplog.at_level(logging.WARNING, logger="slea.runs.loggers"):
        lg.log(1, {"train/success": 0.5})
        lg.log(2, {"train/success": 0.5})
    assert lg.sinks == [] and len(read_metrics(tmp_path / "metrics.jsonl")) == 3
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == ("broken logger off after an error in log: ConnectionError: the tracking server went away; "
                    "metrics.jsonl is still written")


def test_a_missing_package_names_the_extra_once(tmp_path, monkeypatch, caplog):
    import builtins

    real_import = builtins.__import__

    def no_mlflow(name, *args, **kwargs):
        if name.split(".")[0] == "mlflow":
            raise ModuleNotFoundError("No module named 'mlflow'", name="mlflow")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mlflow)
    monkeypatch.setattr(loggers, "_reported", set())
    with caplog.at_level(logging.WARNING, logger="slea.runs.loggers"):
        for i in range(2):
            assert RunLog(tmp_path / f"r{i}", loggers=["jsonl", "mlflow"]).sinks == []
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == ("mlflow logger off: mlflow is not installed (pip install 'slea[mlflow]'); metrics.jsonl is "
                    "still written")
