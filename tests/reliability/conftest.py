"""Shared helpers of the reliability tests: a tiny in-process training config and metric comparison."""

from __future__ import annotations

import os
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Metrics that legitimately differ between two runs of the same config: wall times and rates derived from them.
VOLATILE_PREFIXES = ("time/", "throughput/")
VOLATILE_KEYS = {"library/evolve_s", "update/old_logprobs_s"}  # seconds: each run's own clock


def tiny_config(**sections: dict[str, Any]):
    """A seconds-long training config: the tiny random model on Sokoban (no optional extras needed), 2 groups
    x 2 copies, 3 turns. ``fuzzy_cutoff=0.3`` makes some of the tiny model's babble admissible, so returns
    differ inside a group and the update really trains."""
    from slea.config import build_config

    tree: dict[str, Any] = {
        "run": {"seed": 0, "threads": 1},
        "model": {"name_or_path": "tiny", "dtype": "float32", "lora": True, "lora_r": 4, "lora_alpha": 8,
                  "lora_targets": ["q_proj", "v_proj"]},
        "env": {"id": "slea/Sokoban-v0", "max_steps": 3},
        "rollout": {"groups": 2, "group_size": 2, "max_new_tokens": 4, "fuzzy_cutoff": 0.3},
        "algorithm": {"name": "grpo"},
        "train": {"iterations": 3, "micro_batch": 8},
        "eval": {"before": False, "games": 1, "episodes_per_game": 1, "greedy": False},
    }
    for name, values in sections.items():
        tree.setdefault(name, {}).update(values)
    return build_config(tree)


def comparable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE_PREFIXES) and k not in VOLATILE_KEYS}


def assert_same_metrics(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    """Bitwise-equal metrics rows (case 1 of slea.testing.numerics): both runs on this machine, the same CPU kind
    and thread count; on another ISA or thread count the reductions run in another order."""
    assert [r["iteration"] for r in got] == [r["iteration"] for r in want]
    for g, w in zip(got, want):
        g, w = comparable(g), comparable(w)
        assert g.keys() == w.keys(), (g.keys() ^ w.keys())
        diff = {k: (g[k], w[k]) for k in w if g[k] != w[k] and not (g[k] != g[k] and w[k] != w[k])}  # NaN == NaN
        assert not diff, f"iteration {w['iteration']}: {diff}"


class _Helpers:
    tiny_config = staticmethod(tiny_config)
    comparable = staticmethod(comparable)
    assert_same_metrics = staticmethod(assert_same_metrics)


@pytest.fixture
def rel() -> type[_Helpers]:
    """The helpers above (test modules cannot import a conftest under ``--import-mode=importlib``)."""
    return _Helpers
