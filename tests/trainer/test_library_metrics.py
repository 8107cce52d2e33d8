"""A failed embedder load (experience.use_embeddings) reaches the metrics row the trainer writes."""

import json
from pathlib import Path

import pytest

from slea.config import load_config

SMOKE = str(Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml")
OVER = ["eval.before=false", "eval.greedy=false", "eval.games=1", "eval.episodes_per_game=1",
        "env.max_steps=2", "experience.mode=step",
        "experience.use_embeddings=true", "experience.warmup_iters=0", "experience.min_entries=1",
        "train.iterations=1", "rollout.groups=1", "rollout.group_size=2"]


@pytest.mark.slow
def test_a_failed_embedder_load_is_in_the_iteration_metrics_row(tmp_path, monkeypatch):
    pytest.importorskip("textworld")
    from slea.experience import library as L
    from slea.trainer import rl

    def broken_load():
        raise OSError("weights missing")

    monkeypatch.setattr(L._Embedder, "_instance", None)
    monkeypatch.setattr(L._Embedder, "_failed", False)
    monkeypatch.setattr(L._Embedder, "_load", staticmethod(broken_load))
    t = rl.Trainer(load_config(SMOKE, OVER + [f"run.dir={tmp_path / 'run'}"]))
    assert t.experience.library.use_embeddings
    # the first novelty test loads the embedder; whether this iteration's episodes yield a candidate is up to
    # the tiny model, so the load is made here, as the library's first add would make it
    assert L._Embedder.get() is None and L._Embedder._failed
    t.fit()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["library/embedder_failed"] == 1.0
