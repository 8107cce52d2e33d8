"""The collapse signs of a batch (slea/evaluation/collapse.py), on hand-built episodes."""

from __future__ import annotations

import math

from slea.evaluation.collapse import collapse_metrics, distinct_first_actions, equal_return_fraction
from slea.types import Step, Trajectory


def _traj(group: int, traj: int, rewards: list[float], first: str = "bow", valid: bool = True) -> Trajectory:
    steps = [Step(group, traj, k, "obs", [1], [2], [0.0], reward=r, action=first if k == 0 else "x",
                  valid=valid if k == 0 else True) for k, r in enumerate(rewards)]
    return Trajectory(group, traj, steps=steps)


def test_equal_return_fraction_counts_groups_whose_returns_are_all_equal():
    trajs = [_traj(0, 0, [0.0, 1.0]), _traj(0, 1, [1.0]),  # returns 1, 1: equal
             _traj(1, 2, [0.0]), _traj(1, 3, [0.5]),  # 0, 0.5: not equal
             _traj(2, 4, [0.2, 0.3]), _traj(2, 5, [0.5]), _traj(2, 6, [0.25, 0.25]),  # 0.5 each: equal
             _traj(3, 7, [1.0])]  # a group of one episode does not count
    assert equal_return_fraction(trajs) == 2 / 3
    assert math.isnan(equal_return_fraction([_traj(0, 0, [1.0])]))


def test_distinct_first_actions_is_the_mean_per_group():
    trajs = [_traj(0, 0, [0], "bow"), _traj(0, 1, [0], "bow"), _traj(0, 2, [0], "bow"),  # 1
             _traj(1, 3, [0], "bow"), _traj(1, 4, [0], "kneel"), _traj(1, 5, [0], "bow", valid=False)]  # 3
    assert distinct_first_actions(trajs) == 2.0
    assert collapse_metrics(trajs) == {"equal_return_frac": 1.0, "distinct_first_actions": 2.0}
