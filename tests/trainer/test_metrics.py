"""An iteration's metrics row: merging its rounds (RTPO plays several: counts add up, the library's state is the last
round's), the sampled entropy and the collapse signs."""

from __future__ import annotations

import pytest

from slea.trainer.metrics import merge_library, merge_updates


def test_library_counts_add_up_and_its_state_is_the_last_rounds():
    first = {"added": 2.0, "duplicate": 1.0, "size": 5.0, "size_pos": 3.0, "size_neg_example": 1.0,
             "clusters": 7.0, "clusters_linked": 4.0, "embedder_failed": 1.0, "evolve_s": 0.5}
    second = {"added": 1.0, "duplicate": 0.0, "size": 6.0, "size_pos": 4.0, "size_neg_example": 1.0,
              "clusters": 9.0, "clusters_linked": 5.0, "embedder_failed": 1.0, "evolve_s": 0.25}
    got = merge_library([first, second])
    assert got == {"added": 3.0, "duplicate": 1.0, "size": 6.0, "size_pos": 4.0, "size_neg_example": 1.0,
                   "clusters": 9.0, "clusters_linked": 5.0, "embedder_failed": 1.0, "evolve_s": 0.75}
    assert merge_library([first]) == first and merge_library([]) == {}


def test_update_counts_add_up_maxima_are_kept_and_the_rest_is_averaged():
    got = merge_updates([{"trained_tokens": 10.0, "ratio_max_dev": 0.2, "loss": 1.0},
                         {"trained_tokens": 5.0, "ratio_max_dev": 0.1, "loss": 3.0, "kl": 0.5}])
    assert got["trained_tokens"] == 15.0 and got["ratio_max_dev"] == 0.2
    assert got["loss"] == pytest.approx(2.0) and got["kl"] == pytest.approx(0.5)  # kl: the one round reporting it


def test_an_iteration_row_has_the_sampled_entropy_and_the_collapse_signs():
    """``rollout/entropy`` is the token mean of what the engine reported; ``collapse/*`` come from the played
    episodes (here: two groups, one with equal returns, first actions {bow} and {bow, kneel})."""
    import numpy as np

    from slea.rollout.collector import RolloutStats
    from slea.trainer.metrics import Phases, iteration_metrics
    from slea.types import Step, Trajectory

    def traj(g, i, action, reward):
        return Trajectory(g, i, steps=[Step(g, i, 0, "o", [1], [2], [0.0], reward=reward, action=action)])

    played = [traj(0, 0, "bow", 0.0), traj(0, 1, "bow", 0.0), traj(1, 2, "bow", 1.0), traj(1, 3, "kneel", 0.0)]
    stats = RolloutStats(gen_tokens=8, entropy_sum=6.0, entropy_tokens=4)
    m = iteration_metrics(Phases(played, 4, stats, {}, {}, np.zeros(4), 0, 0, 0), episodes=4, env_steps=4)
    assert m["rollout/entropy"] == 1.5
    assert m["collapse/equal_return_frac"] == 0.5 and m["collapse/distinct_first_actions"] == 1.5
    m = iteration_metrics(Phases(played, 4, RolloutStats(gen_tokens=8), {}, {}, np.zeros(4), 0, 0, 0), 4, 4)
    assert "rollout/entropy" not in m  # an engine that reports no entropy: no made-up value


def test_response_lengths_count_every_turn_and_the_share_cut_at_max_new_tokens():
    """``response/*`` (verl's ``response_length/*``): mean and max over every step row's answer, and the share
    as long as ``rollout.max_new_tokens`` (cut by the limit); ``update/lr`` is the optimizer's."""
    import numpy as np

    from slea.rollout.collector import RolloutStats
    from slea.trainer.metrics import Phases, iteration_metrics, response_metrics
    from slea.types import Step, Trajectory

    def traj(i, *lengths):
        return Trajectory(0, i, steps=[Step(0, i, t, "o", [1], [5] * n, [0.0] * n) for t, n in enumerate(lengths)])

    played = [traj(0, 2, 6), traj(1, 6), traj(2, 3, 0)]  # a turn that generated nothing is not an answer
    assert response_metrics(played, 6) == {"length_mean": 4.25, "length_max": 6.0, "clipped_frac": 0.5}
    assert response_metrics(played, 0) == {"length_mean": 4.25, "length_max": 6.0}  # no limit known: no share
    assert response_metrics([], 6) == {}
    m = iteration_metrics(Phases(played, 3, RolloutStats(), {}, {}, np.zeros(4), 0, 0, 0, max_new_tokens=6,
                                 lr=3e-4, seconds={"rollout": 2.0, "advantages": 0.5}), episodes=3, env_steps=5)
    assert m["response/length_mean"] == 4.25 and m["response/clipped_frac"] == 0.5 and m["update/lr"] == 3e-4
    assert m["time/rollout_s"] == 2.0 and m["time/advantages_s"] == 0.5
    m = iteration_metrics(Phases(played, 3, RolloutStats(), {}, {}, np.zeros(4), 0, 0, 0), 3, 5)
    assert "update/lr" not in m  # no optimizer said so: no made-up value


def test_no_update_line_names_the_groups_and_the_metric_only_when_every_group_returned_the_same():
    """Before, an iteration whose task groups all returned the same showed only ``loss —`` (TeamTR: ``0 steps``):
    nothing said why. ``collapse/groups`` counts the groups of two or more episodes (a lone episode has no pair)."""
    from slea.trainer.metrics import group_collapse, no_update_line
    from slea.types import Step, Trajectory

    def traj(g, i, reward):
        return Trajectory(g, i, steps=[Step(g, i, 0, "o", [1], [2], [0.0], reward=reward, action="go")])

    flat = [traj(0, 0, -0.3), traj(0, 1, -0.3), traj(1, 2, 1.0), traj(1, 3, 1.0), traj(2, 4, 0.0), traj(2, 5, 0.0),
            traj(3, 6, 5.0)]  # group 3 has one episode: not counted
    row = group_collapse(flat)
    assert row["collapse/groups"] == 3.0 and row["collapse/equal_return_frac"] == 1.0
    assert no_update_line(row) == "no update: all 3 groups had equal returns (collapse/equal_return_frac 1.0)"
    assert no_update_line(group_collapse(flat[:2])) == ("no update: its one group had equal returns "
                                                       "(collapse/equal_return_frac 1.0)")
    mixed = group_collapse([*flat[:4], traj(2, 4, 0.0), traj(2, 5, 1.0)])
    assert mixed["collapse/equal_return_frac"] == pytest.approx(2 / 3) and no_update_line(mixed) is None
    alone = group_collapse([traj(0, 0, 1.0), traj(1, 1, 0.0)])  # no group of two: nothing to say
    assert alone["collapse/groups"] == 0.0 and no_update_line(alone) is None
