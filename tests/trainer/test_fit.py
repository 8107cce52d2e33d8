"""Trainer.fit: a run stopped by its time budget between checkpoints still saves the weights it evaluates."""

import json
from pathlib import Path

import pytest

from slea.config import load_config
from slea.trainer import checkpoint as ckpt

SMOKE = str(Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml")


@pytest.mark.slow
def test_a_budget_stop_between_saves_checkpoints_the_last_iteration(tmp_path):
    pytest.importorskip("textworld")
    from slea.trainer.rl import Trainer

    run = tmp_path / "run"
    # save_every 10 never comes round; a 1 ms budget lets one iteration start, none after it
    cfg = load_config(SMOKE, [f"run.dir={run}", "train.iterations=5", "train.save_every=10",
                              "train.time_budget_s=1e-3", "eval.before=false", "eval.greedy=false",
                              "eval.games=1", "eval.episodes_per_game=1", "env.max_steps=2"])
    summary = Trainer(cfg).fit()
    logged = [json.loads(x)["iteration"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert logged == [0]  # the budget check lets the first iteration run, then stops
    assert ckpt.latest_checkpoint(run / "checkpoints").name == "iter_000000"
    assert summary["checkpoint"] == "iter_000000"
