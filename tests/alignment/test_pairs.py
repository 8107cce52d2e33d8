"""ETO-style pairing of failed trajectories with the expert trajectory of their task."""

from __future__ import annotations

import random

import pytest

from slea.alignment.data import EpisodeRecord, Turn
from slea.alignment.pairs import build_pairs, pairing_summary


def Traj(env: str, task: str, seed: int, source: str, success: bool, n_turns: int = 2, ret: float = 0.0,
         split: str = "train") -> EpisodeRecord:
    """A trajectory of ``n_turns`` placeholder turns."""
    turns = [Turn([{"role": "user", "content": f"obs {i}"}], f"act {i}") for i in range(n_turns)]
    return EpisodeRecord(env, task, split, seed, source, success, ret, turns)


A, B = "slea/ALFWorld-v0", "slea/ScienceWorld-v0"


def _toy():
    expert = [
        Traj(A, "t1", 0, "walkthrough", True, n_turns=5),
        Traj(A, "t1", 1, "walkthrough", True, n_turns=3),   # fewer turns: the expert of (A, t1)
        Traj(A, "t1", 2, "walkthrough", False, n_turns=1),  # not a success: never chosen
        Traj(A, "t2", 0, "walkthrough", True, n_turns=4),
        Traj(B, "t1", 0, "gold", True, n_turns=6),          # same task id in another env: another task
    ]
    failures = [
        Traj(A, "t1", 7, "sft", False),
        Traj(A, "t1", 3, "sft", False),
        Traj(A, "t1", 5, "sft", True, ret=1.0),   # a success: not a failure
        Traj(A, "t2", 1, "sft", False, n_turns=0),  # no turns: nothing to train on
        Traj(A, "t3", 0, "sft", False),            # no expert for t3
        Traj(B, "t1", 4, "sft", False),
    ]
    return expert, failures


def test_pairs_on_a_toy_set():
    expert, failures = _toy()
    pairs = build_pairs(expert, failures)
    got = [(p.env, p.task, p.chosen.seed, p.rejected.seed) for p in pairs]
    # sorted by (env, task, failure seed); (A, t1)'s expert is seed 1 (3 turns)
    assert got == [(A, "t1", 1, 3), (A, "t1", 1, 7), (B, "t1", 0, 4)]
    assert all(p.chosen.success and not p.rejected.success for p in pairs)
    assert all(p.chosen.env == p.rejected.env and p.chosen.task == p.rejected.task for p in pairs)


def test_pairs_do_not_depend_on_input_order():
    expert, failures = _toy()
    ref = [(p.chosen.seed, p.rejected.seed, p.env, p.task) for p in build_pairs(expert, failures)]
    for seed in range(5):
        rng = random.Random(seed)
        e, f = expert[:], failures[:]
        rng.shuffle(e)
        rng.shuffle(f)
        assert [(p.chosen.seed, p.rejected.seed, p.env, p.task) for p in build_pairs(e, f)] == ref


def test_max_per_task_and_summary():
    expert, failures = _toy()
    pairs = build_pairs(expert, failures, max_per_task=1)
    assert [(p.task, p.rejected.seed) for p in pairs] == [("t1", 3), ("t1", 4)]
    assert pairing_summary(expert, failures, pairs) == {
        "pairs": 2, "tasks_paired": 2, "failures_without_expert": 1, "sampled_successes": 1}
    with pytest.raises(ValueError, match="max_per_task"):
        build_pairs(expert, failures, max_per_task=0)


def test_no_experts_no_pairs():
    _, failures = _toy()
    assert build_pairs([], failures) == []
