"""A seconds-long SLEA-RL run on the tiny random model: what the report tests and ``bench/report_screenshot.py``
make a report of (a run folder with metrics, evaluations, a library and recorded episodes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def tiny_slea_config(run_dir: str | Path, iterations: int = 2, **run: Any):
    """The tiny model on Sokoban (no optional extras), 2 groups x 2 copies, 3 turns, SLEA-RL retrieving from
    iteration 1 (no warm-up; one entry opens the gate). ``fuzzy_cutoff=0.3`` makes some of the tiny model's
    babble admissible, so episodes differ and some win. ``run``: more ``run.*`` keys."""
    from slea.config import build_config

    return build_config({
        "run": {"seed": 0, "threads": 1, "dir": str(run_dir), **run},
        "model": {"name_or_path": "tiny", "dtype": "float32", "lora": True, "lora_r": 4, "lora_alpha": 8,
                  "lora_targets": ["q_proj", "v_proj"]},
        "env": {"id": "slea/Sokoban-v0", "max_steps": 3},
        "rollout": {"groups": 2, "group_size": 2, "max_new_tokens": 4, "fuzzy_cutoff": 0.3},
        "algorithm": {"name": "slea"},
        "train": {"iterations": iterations, "micro_batch": 8},
        "eval": {"before": True, "games": 1, "episodes_per_game": 1, "greedy": False},
        "experience": {"mode": "step", "warmup_iters": 0, "min_entries": 1},
    })


def tiny_slea_run(run_dir: str | Path, iterations: int = 2, **run: Any) -> Path:
    """Train :func:`tiny_slea_config` into ``run_dir``; returns it."""
    from slea.trainer.rl import Trainer

    Trainer(tiny_slea_config(run_dir, iterations, **run)).fit()
    return Path(run_dir)
