"""Reference-code conventions, on hand-computed cases (expected values written out, never computed by slea):
the invalid-action penalty charged after discounting (GiGPO's ``apply_invalid_action_penalty``) or folded into
the rewards, the singleton-group rule, and episode statistics over step rows (``cross_step_stats``)."""

from __future__ import annotations

import numpy as np
import pytest

from slea.algorithms import StepBatch, compute_advantages
from slea.algorithms.advantages import step_returns
from slea.types import Step

approx = pytest.approx

# One task group, two trajectories of two turns, gamma 0.5.
#   τ0: env rewards [0, 1], step 0 invalid (penalty 0.1);  τ1: env rewards [0, 0], step 1 invalid.
G, T, S = [0, 0, 0, 0], [0, 0, 1, 1], [0, 1, 0, 1]
ENV = [0.0, 1.0, 0.0, 0.0]
PEN = [0.1, 0.0, 0.0, 0.1]
FOLDED = [-0.1, 1.0, 0.0, -0.1]
ANCHORS = ["start", "hall", "start", "yard"]  # both trajectories start in the same state


def _adv(name, rewards, penalties=None, **kw):
    return compute_advantages(name, G, T, S, rewards, anchors=ANCHORS, penalties=penalties, gamma=0.5, **kw)


def test_penalty_after_discounting_is_not_propagated():
    # step mode: R̂ = [0 + .5·1 − .1, 1, 0 + .5·0, 0 − .1] = [.4, 1, 0, −.1]
    at_step = step_returns(StepBatch(G, T, S, ENV, penalties=PEN), 0.5)
    assert at_step == approx([0.4, 1.0, 0.0, -0.1])
    # folded: τ1's penalty at turn 1 also lowers its turn 0: R̂_0 = 0 + .5·(−.1) = −.05
    folded = step_returns(StepBatch(G, T, S, FOLDED), 0.5)
    assert folded == approx([0.4, 1.0, -0.05, -0.1])


def test_grpo_scores_each_row_with_its_own_penalty():
    # rows score R(τ) − p_t = [.9, 1, 0, −.1]; trajectories R − mean p = [.95, −.05], mean .45
    out = _adv("grpo", ENV, PEN, std_norm=False)
    assert out == approx([0.45, 0.55, -0.45, -0.55])
    # with std: the trajectories' std (ddof 1) is 1/sqrt(2)
    out = _adv("grpo", ENV, PEN, eps=0.0)
    assert out == approx(np.array([0.45, 0.55, -0.45, -0.55]) * np.sqrt(2))
    # folded: R = [.9, −.1], mean .4: every row of a trajectory gets the same advantage
    assert _adv("grpo", FOLDED, std_norm=False) == approx([0.5, 0.5, -0.5, -0.5])


def test_gigpo_penalty_at_step_and_folded():
    # step level: turn 0 shares the anchor "start": R̂ [.4, 0] -> centred [.2, −.2]; turn 1 anchors are singletons
    out = _adv("gigpo", ENV, PEN, std_norm=False, step_weight=1.0)
    assert out == approx([0.45 + 0.2, 0.55, -0.45 - 0.2, -0.55])
    # folded: episode [.5, .5, −.5, −.5]; turn 0 R̂ [.4, −.05] -> [.225, −.225]
    out = _adv("gigpo", FOLDED, std_norm=False, step_weight=1.0)
    assert out == approx([0.725, 0.5, -0.725, -0.5])


def test_rloo_rows_against_the_other_trajectories():
    # trajectory scores [.95, −.05]; τ0's rows [.9, 1] minus −.05, τ1's rows [0, −.1] minus .95
    assert _adv("rloo", ENV, PEN) == approx([0.95, 1.05, -0.95, -1.05])


def test_no_penalty_column_equals_zero_penalties():
    for name in ("grpo", "rloo", "reinforce_pp", "gigpo"):
        assert _adv(name, ENV, [0.0] * 4) == approx(_adv(name, ENV), abs=1e-12), name


def test_from_steps_keeps_penalties_apart_or_folds_them():
    def step(traj, t, reward, penalty):
        return Step(group_id=0, traj_id=traj, step=t, anchor="x", prompt_ids=[1], response_ids=[2],
                    old_logprobs=[0.0], reward=reward, penalty=penalty)

    rows = [step(0, 0, -0.1, 0.1), step(0, 1, 1.0, 0.0)]  # Step.reward has the penalty in it
    apart = StepBatch.from_steps(rows)
    assert list(apart.rewards) == approx([0.0, 1.0]) and list(apart.penalties) == approx([0.1, 0.0])
    folded = StepBatch.from_steps(rows, penalty_at="return")
    assert list(folded.rewards) == approx([-0.1, 1.0]) and folded.penalties is None
    assert list(apart.folded_rewards) == approx(list(folded.rewards))
    with pytest.raises(ValueError, match="penalty_at"):
        StepBatch.from_steps(rows, penalty_at="episode")


# ---- singleton groups: 0 (default) or the reference code's mean 0 / std 1 ---------------------------------- #


def test_singleton_group_rules():
    g, t, s, r = [0, 1, 1], [0, 0, 1], [0, 0, 0], [2.0, 1.0, 0.0]  # group 0 has one trajectory, R = 2
    kw = {"eps": 1e-6}
    assert compute_advantages("grpo", g, t, s, r, **kw)[0] == 0.0
    assert compute_advantages("grpo", g, t, s, r, singleton="reference", **kw)[0] == approx(2.0 / (1 + 1e-6),
                                                                                            rel=1e-12)
    assert compute_advantages("grpo", g, t, s, r, singleton="reference", std_norm=False)[0] == 2.0
    assert compute_advantages("rloo", g, t, s, r, singleton="reference")[0] == 2.0
    assert compute_advantages("rloo", g, t, s, r)[0] == 0.0
    # the two-member group is unaffected: R [1, 0], mean .5, std 1/sqrt(2) -> ±sqrt(.5)
    ref = compute_advantages("grpo", g, t, s, r, singleton="reference", eps=0.0)
    assert ref[1:] == approx([np.sqrt(0.5), -np.sqrt(0.5)])
    with pytest.raises(ValueError, match="singleton"):
        compute_advantages("grpo", g, t, s, r, singleton="one")


def test_singleton_rule_keeps_step_groups_at_zero():
    # gigpo, one trajectory per group: episode level R/(1+eps) under "reference", step groups are singletons (0)
    out = compute_advantages("gigpo", [0, 0], [0, 0], [0, 1], [0.0, 3.0], anchors=["a", "b"], gamma=1.0,
                             singleton="reference", eps=0.0)
    assert out == approx([3.0, 3.0])


# ---- episode statistics over step rows (verl-agent's compute_mean_std_cross_steps) ------------------------ #

# τ0 three turns, R = 1; τ1 one turn, R = 0
CG, CT, CS, CR = [0, 0, 0, 0], [0, 0, 0, 1], [0, 1, 2, 0], [0.0, 0.0, 1.0, 0.0]


def test_grpo_cross_step_stats():
    per_traj = compute_advantages("grpo", CG, CT, CS, CR, std_norm=False)
    assert per_traj == approx([0.5, 0.5, 0.5, -0.5])
    # rows [1, 1, 1, 0]: mean .75
    rows = compute_advantages("grpo", CG, CT, CS, CR, std_norm=False, cross_step_stats=True)
    assert rows == approx([0.25, 0.25, 0.25, -0.75])
    # std over rows (ddof 1): sqrt(.75/3) = .5
    rows = compute_advantages("grpo", CG, CT, CS, CR, eps=0.0, cross_step_stats=True)
    assert rows == approx([0.5, 0.5, 0.5, -1.5])


def test_rloo_cross_step_stats():
    assert compute_advantages("rloo", CG, CT, CS, CR) == approx([1.0, 1.0, 1.0, -1.0])
    # each row against the mean of the other three rows: τ0 rows 1 − 2/3, τ1's row 0 − 1
    rows = compute_advantages("rloo", CG, CT, CS, CR, cross_step_stats=True)
    assert rows == approx([1 / 3, 1 / 3, 1 / 3, -1.0])
