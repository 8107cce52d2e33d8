"""The mechanism's figures (slea.evaluation.mechanism) on hand-built episodes."""

from __future__ import annotations

import pytest

from slea.evaluation.evaluate import summarize
from slea.evaluation.mechanism import mechanism_metrics
from slea.types import Step, Trajectory


def _step(g, t, i, *, cluster=-1, exp=(), right=None, lessons=None, action="go east", valid=True):
    info = {}
    if exp:
        info["right_state"] = right
        if lessons is not None:
            info["lesson_actions"] = lessons
    return Step(g, t, i, f"obs {i}", [1], [2], [0.0], action=action, valid=valid, cluster_id=cluster,
                experience_ids=list(exp), info=info)


def test_rates_and_step_group_size_by_hand():
    a = Trajectory(0, 0, steps=[
        _step(0, 0, 0, cluster=5, exp=[1], right=True, lessons=["take coin"], action="Take  coin"),  # followed
        _step(0, 0, 1, cluster=6, exp=[2], right=False, lessons=["open chest"], action="go east"),  # not
        _step(0, 0, 2, cluster=5)])
    b = Trajectory(0, 1, steps=[
        _step(0, 1, 0, cluster=5, exp=[1], right=True, lessons=[]),  # a hit quoting no command
        _step(0, 1, 1, cluster=7, exp=[3], right=None, lessons=["go west"], action="x", valid=False)])
    c = Trajectory(1, 2, steps=[_step(1, 2, 0, cluster=5), _step(1, 2, 1)])  # cluster 5 in another task group
    m = mechanism_metrics([a, b, c])
    assert m["retrieval_hit_rate"] == pytest.approx(4 / 7)
    assert m["retrieval_right_state"] == pytest.approx(2 / 3)  # True, False, True; the None is not judged
    assert m["lesson_followed"] == pytest.approx(1 / 3)  # quoting hits: a0 (followed), a1, b1 (invalid)
    # step groups (task group, cluster): (0,5) x3, (0,6) x1, (0,7) x1, (1,5) x1 -> rows 3,1,3,3,1,1
    assert m["step_group_size"] == pytest.approx(12 / 6)
    assert summarize([a, b, c])["retrieval_right_state"] == m["retrieval_right_state"]


def test_no_library_gives_zeros_not_missing_keys():
    m = mechanism_metrics([Trajectory(0, 0, steps=[_step(0, 0, 0)])])
    assert m == {"retrieval_hit_rate": 0.0, "retrieval_right_state": 0.0, "lesson_followed": 0.0,
                 "step_group_size": 0.0}
