"""Advantage estimators: hand-computed cases (expected values are written out, never computed by slea) and a
randomized comparison against a naive per-row reference written here."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest

from slea.algorithms import (
    StepBatch,
    algorithm_names,
    compute_advantages,
    discounted_returns,
    episode_returns,
    estimate,
    get_algorithm,
    register_algorithm,
)
from slea.algorithms import registry as reg

approx = pytest.approx
SQRT1_3 = 0.5773502691896258  # sqrt(1/3)


def adv(name, g, t, s, r, **kw):
    return compute_advantages(name, np.asarray(g), np.asarray(t), np.asarray(s), np.asarray(r, float), **kw)


# ----------------------------------------------------------------------------------------------------------- #
# registry                                                                                                     #
# ----------------------------------------------------------------------------------------------------------- #


def test_registry_names_and_unknown():
    assert {"grpo", "rloo", "reinforce_pp", "gigpo", "slea", "ppo", "turn_ppo"} <= set(algorithm_names())
    with pytest.raises(KeyError) as exc:
        get_algorithm("nope")
    for known in ("gigpo", "grpo", "reinforce_pp", "rloo", "slea"):
        assert known in str(exc.value)
    with pytest.raises(KeyError, match="known: .*grpo"):
        adv("bogus", [0], [0], [0], [1.0])
    assert get_algorithm("GRPO") is get_algorithm("grpo")  # case-insensitive


def test_specs_declare_level_needs_and_settings():
    """The trainer reads these, never the names: each built-in's declaration as the papers define it."""
    expect = {  # name: (level, needs, settings read from algorithm.<key>)
        "grpo": ("trajectory", set(), {"std_norm", "eps"}),
        "rloo": ("trajectory", set(), set()),
        "reinforce_pp": ("trajectory", set(), {"std_norm", "eps"}),
        "gigpo": ("turn", set(), {"gamma", "step_weight", "std_norm", "eps"}),
        "slea": ("turn", {"clusters"}, {"gamma", "step_weight", "std_norm", "eps"}),
        "turn_ppo": ("turn", {"critic"}, {"turn_gamma", "turn_lambda", "adv_whiten"}),
        "ppo": ("token", {"critic"}, {"gae_gamma", "gae_lambda", "adv_whiten"}),
    }
    for name, (level, needs, required) in expect.items():
        spec = get_algorithm(name)
        assert (spec.level, set(spec.needs), set(spec.required)) == (level, needs, required), name
    assert get_algorithm("slea").defaults == {"experience.mode": "step"}
    assert set(get_algorithm("gigpo").settings) - set(get_algorithm("gigpo").required) == {
        "cross_step_stats", "singleton", "similarity_threshold", "anchor_on"}


def test_register_rejects_unknown_level_and_needs():
    with pytest.raises(ValueError, match="level"):
        register_algorithm("test_bad_level", level="episode")
    with pytest.raises(ValueError, match="unknown needs"):
        register_algorithm("test_bad_need", level="turn", needs=("oracle",))


def test_register_custom_estimator_and_duplicate():
    name = "test_constant_estimator"
    try:

        @register_algorithm(name, level="trajectory")
        def constant(batch, *, value=7.0):
            return np.full(batch.n, value)

        assert name in algorithm_names()
        assert get_algorithm(name).settings == ("value",) and get_algorithm(name).required == ()
        assert adv(name, [0, 0], [0, 1], [0, 0], [1, 2]).tolist() == [7.0, 7.0]
        assert adv(name, [0, 0], [0, 1], [0, 0], [1, 2], value=2.0).tolist() == [2.0, 2.0]
        with pytest.raises(ValueError, match="already registered"):
            register_algorithm(name, level="turn")(lambda batch: None)
    finally:
        reg.ALGORITHMS.remove(name)


def test_estimate_broadcasts_row_advantages_to_tokens_and_checks_shapes():
    batch = StepBatch(np.array([0, 0]), np.array([0, 1]), np.array([0, 0]), np.array([1.0, 0.0]),
                      response_lengths=np.array([3, 1]))
    out = estimate(get_algorithm("rloo"), batch, {})
    assert out.rows.tolist() == [1.0, -1.0]
    assert [t.tolist() for t in out.per_token(batch.response_lengths)] == [[1.0, 1.0, 1.0], [-1.0]]
    name = "test_wrong_shape"
    try:
        register_algorithm(name, level="trajectory")(lambda batch: np.zeros(batch.n + 1))
        with pytest.raises(ValueError, match="returned"):
            estimate(get_algorithm(name), batch, {})
    finally:
        reg.ALGORITHMS.remove(name)
    with pytest.raises(TypeError, match="std_norm"):
        estimate(get_algorithm("grpo"), batch, {"eps": 1e-6})  # a required setting missing


def test_unknown_option_is_type_error():
    with pytest.raises(TypeError, match="similarity_threshold"):
        adv("grpo", [0, 0], [0, 1], [0, 0], [1, 0], similarity_threshold=0.9)
    with pytest.raises(TypeError):
        adv("gigpo", [0, 0], [0, 1], [0, 0], [1, 0], anchors=["a", "b"], typo_option=1)


# ----------------------------------------------------------------------------------------------------------- #
# GRPO / Dr.GRPO                                                                                               #
# ----------------------------------------------------------------------------------------------------------- #


def test_grpo_ties_std_on_and_off():
    # one group, 4 trajectories; R = [1, 1, 0, 0] (traj 0 has two rows 0 + 1, traj 1 has 0.5 + 0.5: a tie)
    g = [0, 0, 0, 0, 0, 0]
    t = [0, 0, 1, 1, 2, 3]
    s = [0, 1, 0, 1, 0, 0]
    r = [0.0, 1.0, 0.5, 0.5, 0.0, 0.0]
    # mean 0.5, unbiased std sqrt(1/3): A = ±0.5 / 0.57735 = ±0.8660254
    out = adv("grpo", g, t, s, r, eps=0.0)
    assert out.dtype == np.float64
    assert out == approx([0.8660254037844387] * 4 + [-0.8660254037844387] * 2, abs=1e-12)
    out = adv("grpo", g, t, s, r)  # eps 1e-6 in the denominator
    assert out[0] == approx(0.5 / (SQRT1_3 + 1e-6), abs=1e-12)
    # Dr.GRPO: no std
    assert adv("grpo", g, t, s, r, std_norm=False) == approx([0.5] * 4 + [-0.5] * 2, abs=1e-12)


def test_grpo_singletons_and_all_equal():
    # group 7: one trajectory (two rows) -> 0; group 8: three trajectories with reward 0.1 each -> exactly 0
    g = [7, 7, 8, 8, 8]
    t = [0, 0, 0, 1, 2]
    s = [0, 1, 0, 0, 0]
    r = [3.0, 4.0, 0.1, 0.1, 0.1]
    for std_norm in (True, False):
        out = adv("grpo", g, t, s, r, std_norm=std_norm)
        assert out.tolist() == [0.0] * 5  # exact zeros, no rounding residue
    assert adv("rloo", g, t, s, r).tolist() == [0.0] * 5
    assert adv("reinforce_pp", g, t, s, r).tolist() == [0.0] * 5


def test_grpo_groups_are_independent_and_row_order_is_kept():
    # two groups, rows shuffled; traj ids restart in every group
    g = [1, 0, 1, 0]
    t = [0, 1, 1, 0]
    s = [0, 0, 0, 0]
    r = [2.0, 0.0, 4.0, 1.0]
    # group 0: R = {traj0: 1, traj1: 0} -> mean .5, std sqrt(.5); group 1: {2, 4} -> mean 3, std sqrt(2)
    out = adv("grpo", g, t, s, r, eps=0.0)
    assert out == approx([-0.7071067811865475, -0.7071067811865475, 0.7071067811865475, 0.7071067811865475])


# ----------------------------------------------------------------------------------------------------------- #
# RLOO, REINFORCE++                                                                                            #
# ----------------------------------------------------------------------------------------------------------- #


def test_rloo():
    # group 0: R = [3, 0, 0]: A0 = 3 - 0 = 3, A1 = 0 - 1.5 = -1.5, A2 = -1.5; group 1 singleton -> 0
    g = [0, 0, 0, 0, 1]
    t = [0, 0, 1, 2, 0]
    s = [0, 1, 0, 0, 0]
    r = [1.0, 2.0, 0.0, 0.0, 5.0]
    assert adv("rloo", g, t, s, r) == approx([3.0, 3.0, -1.5, -1.5, 0.0], abs=1e-12)


def test_reinforce_pp():
    # group 0: R [1, 0] -> centred [.5, -.5]; group 1: R [2, 2, 5] -> [-1, -1, 2]; group 2 singleton -> 0
    # batch (6 trajectories): mean 0, unbiased var 6.5/5 = 1.3, std 1.1401754250991
    g = [0, 0, 1, 1, 1, 2]
    t = [0, 1, 0, 1, 2, 0]
    s = [0, 0, 0, 0, 0, 0]
    r = [1.0, 0.0, 2.0, 2.0, 5.0, 7.0]
    out = adv("reinforce_pp", g, t, s, r, eps=0.0)
    assert out == approx([0.43852900965, -0.43852900965, -0.87705801931, -0.87705801931, 1.75411603861, 0.0])
    # std off: only centred (batch mean is 0 here)
    assert adv("reinforce_pp", g, t, s, r, std_norm=False) == approx([0.5, -0.5, -1, -1, 2, 0], abs=1e-12)
    # a row per step: the statistics are over trajectories, not rows
    g2 = [0, 0, 0, 0, 1, 1, 1, 2]
    t2 = [0, 0, 0, 1, 0, 1, 2, 0]
    s2 = [0, 1, 2, 0, 0, 0, 0, 0]
    r2 = [0.0, 0.0, 1.0, 0.0, 2.0, 2.0, 5.0, 7.0]
    out2 = adv("reinforce_pp", g2, t2, s2, r2, eps=0.0)
    assert out2 == approx(
        [0.43852900965] * 3 + [-0.43852900965, -0.87705801931, -0.87705801931, 1.75411603861, 0.0]
    )


# ----------------------------------------------------------------------------------------------------------- #
# returns                                                                                                      #
# ----------------------------------------------------------------------------------------------------------- #


def test_discounted_and_episode_returns():
    # trajectory 5: steps 2, 0, 1 (given out of order), rewards 3, 1, 2; gamma .5
    # R^_2 = 3, R^_1 = 2 + .5*3 = 3.5, R^_0 = 1 + .5*3.5 = 2.75; trajectory 9: single step 4 -> 4
    t = [5, 9, 5, 5]
    s = [2, 0, 0, 1]
    r = [3.0, 4.0, 1.0, 2.0]
    assert discounted_returns(t, s, r, 0.5) == approx([3.0, 4.0, 2.75, 3.5])
    assert discounted_returns(t, s, r, 1.0) == approx([3.0, 4.0, 6.0, 5.0])
    assert discounted_returns(t, s, r, 0.0) == approx([3.0, 4.0, 1.0, 2.0])
    assert episode_returns(t, r) == approx([6.0, 4.0, 6.0, 6.0])
    # sparse reward: R^_t = gamma^(T-1-t) R
    assert discounted_returns([0] * 4, [0, 1, 2, 3], [0, 0, 0, 10.0], 0.95) == approx(
        [8.57375, 9.025, 9.5, 10.0]
    )


def test_input_validation():
    with pytest.raises(ValueError, match="duplicate"):
        adv("grpo", [0, 0], [0, 0], [1, 1], [1.0, 2.0])
    with pytest.raises(ValueError, match="anchors"):
        adv("gigpo", [0, 0], [0, 1], [0, 0], [1.0, 2.0])
    with pytest.raises(ValueError, match="clusters"):
        adv("slea", [0, 0], [0, 1], [0, 0], [1.0, 2.0])
    with pytest.raises(ValueError, match="rewards"):
        adv("grpo", [0, 0], [0, 1], [0, 0], [1.0])
    with pytest.raises(ValueError, match="gamma"):
        adv("gigpo", [0, 0], [0, 1], [0, 0], [1.0, 2.0], anchors=["a", "a"], gamma=1.5)
    assert adv("gigpo", [], [], [], [], anchors=[]).shape == (0,)


# ----------------------------------------------------------------------------------------------------------- #
# GiGPO                                                                                                        #
# ----------------------------------------------------------------------------------------------------------- #

# One task group, two trajectories, gamma 0.5:
#   A: anchors [s0, s1, s0], rewards [0, 1, 2] -> R_A = 3, R^ = [1, 2, 2]  (s0 repeats inside A)
#   B: anchors [s0, s2],     rewards [1, 0]    -> R_B = 1, R^ = [1, 0]     (s0 repeats across A and B)
# Episode: mean 2, std sqrt(2) -> A_ep = ±0.70710678.
# Step group s0 = {A0: 1, A2: 2, B0: 1}: mean 4/3, devs [-1/3, 2/3, -1/3], unbiased std sqrt(1/3)
#   -> A_step = [-0.57735027, 1.15470054, -0.57735027]; s1 = {A1}, s2 = {B1}: singletons -> 0.
GIG = {"g": [0, 0, 0, 0, 0], "t": [0, 0, 0, 1, 1], "s": [0, 1, 2, 0, 1], "r": [0.0, 1.0, 2.0, 1.0, 0.0]}
GIG_ANCHORS = ["s0", "s1", "s0", "s0", "s2"]


def _gig(**kw):
    return adv("gigpo", GIG["g"], GIG["t"], GIG["s"], GIG["r"], anchors=GIG_ANCHORS, gamma=0.5, **kw)


def test_gigpo_repeated_states_discounting_std_on():
    out = _gig(eps=0.0)
    assert out == approx([0.12975651199, 0.70710678119, 1.86180732308, -1.28445705037, -0.70710678119])


def test_gigpo_std_off_and_step_weight():
    # A_ep = ±1, A_step(s0) = [-1/3, 2/3, -1/3]
    assert _gig(std_norm=False) == approx([2 / 3, 1.0, 5 / 3, -4 / 3, -1.0], abs=1e-12)
    assert _gig(std_norm=False, step_weight=0.5) == approx([5 / 6, 1.0, 4 / 3, -7 / 6, -1.0], abs=1e-12)
    assert _gig(std_norm=False, step_weight=0.0) == approx([1.0, 1.0, 1.0, -1.0, -1.0], abs=1e-12)


def test_gigpo_cross_step_stats():
    # episode statistics over the 5 rows [3, 3, 3, 1, 1]: mean 2.2, unbiased std sqrt(1.2)
    out = _gig(eps=0.0, step_weight=0.0, cross_step_stats=True)
    assert out == approx([0.73029674334] * 3 + [-1.09544511501] * 2)
    out = _gig(std_norm=False, step_weight=0.0, cross_step_stats=True)
    assert out == approx([0.8] * 3 + [-1.2] * 2, abs=1e-12)
    # and the step part is unchanged by the option
    full = _gig(eps=0.0, cross_step_stats=True)
    assert full == approx(
        [
            0.73029674334 - 0.57735026919,
            0.73029674334,
            0.73029674334 + 1.15470053838,
            -1.09544511501 - 0.57735026919,
            -1.09544511501,
        ]
    )


def test_gigpo_anchored_on_state_keys_groups_equivalent_states():
    # the raw anchors are all different (singletons: GRPO), but s0's three rows share a state key: the hand case
    # above (A_step(s0) = [-1/3, 2/3, -1/3] with std off)
    raw = ["room 1 filler", "x", "room 2 other filler", "room 3", "y"]
    keys = ["exits: east", "k1", "exits: east", "exits: east", "k2"]
    kw = {"anchors": raw, "gamma": 0.5, "std_norm": False}
    assert adv("gigpo", GIG["g"], GIG["t"], GIG["s"], GIG["r"], **kw) == approx([1.0, 1.0, 1.0, -1.0, -1.0])
    on_keys = adv("gigpo", GIG["g"], GIG["t"], GIG["s"], GIG["r"], state_keys=keys, anchor_on="state_key", **kw)
    assert on_keys == approx([2 / 3, 1.0, 5 / 3, -4 / 3, -1.0], abs=1e-12)
    with pytest.raises(ValueError, match="anchor_on"):
        adv("gigpo", GIG["g"], GIG["t"], GIG["s"], GIG["r"], anchor_on="cluster", **kw)


def test_gigpo_all_singleton_step_groups_equals_grpo():
    g = [0, 0, 0, 0, 1, 1]
    t = [0, 0, 1, 1, 0, 1]
    s = [0, 1, 0, 1, 0, 0]
    r = [0.0, 1.0, 0.0, 0.0, 2.0, 0.0]
    anchors = ["a", "b", "c", "d", "a", "b"]  # same text in another task group is another step group
    assert adv("gigpo", g, t, s, r, anchors=anchors) == approx(adv("grpo", g, t, s, r), abs=1e-15)
    # and the same anchor across groups does not group them: group 1 has 'a' once
    out = adv("gigpo", g, t, s, r, anchors=["a", "a", "a", "a", "a", "a"], gamma=1.0, std_norm=False)
    # group 0: A_ep = [.5, .5, -.5, -.5]; step 'a' in group 0: R^ = [1, 1, 0, 0] -> [.5, .5, -.5, -.5]
    # group 1: A_ep = [1, -1]; step 'a' in group 1: R^ = [2, 0] -> [1, -1]
    assert out == approx([1.0, 1.0, -1.0, -1.0, 2.0, -2.0], abs=1e-12)


def test_gigpo_similarity_grouping_is_greedy_against_first_member():
    A, B, D, C = "aaaaaaaaaa", "aaaaaaaaab", "aaaaaaaabb", "zzzzzzzzzz"
    # difflib ratios: (B, A) = 0.9, (D, A) = 0.8, (D, B) = 0.9, C vs any = 0
    g, s = [0, 0, 0, 0], [0, 0, 0, 0]
    t = [0, 1, 2, 3]
    # order A, D, B, C: groups {A, B}, {D}, {C}. rewards [1, 1, 0, 0]; std off
    # A_ep = [.5, .5, -.5, -.5]; step {A: 1, B: 0} -> [.5, -.5]
    out = adv(
        "gigpo", g, t, s, [1.0, 1.0, 0.0, 0.0], anchors=[A, D, B, C], std_norm=False, similarity_threshold=0.9
    )
    assert out == approx([1.0, 0.5, -1.0, -0.5], abs=1e-12)
    # order B, D, A, C: B is the prototype, D and A both join it: {B, D, A}, {C}. rewards [0, 1, 1, 0]
    # A_ep = [-.5, .5, .5, -.5]; step {0, 1, 1}: mean 2/3 -> [-2/3, 1/3, 1/3]
    out = adv(
        "gigpo", g, t, s, [0.0, 1.0, 1.0, 0.0], anchors=[B, D, A, C], std_norm=False, similarity_threshold=0.9
    )
    assert out == approx([-7 / 6, 5 / 6, 5 / 6, -0.5], abs=1e-12)
    # threshold above every ratio -> exact grouping only (all singletons here) = GRPO
    out = adv(
        "gigpo",
        g,
        t,
        s,
        [0.0, 1.0, 1.0, 0.0],
        anchors=[B, D, A, C],
        std_norm=False,
        similarity_threshold=0.95,
    )
    assert out == approx([-0.5, 0.5, 0.5, -0.5], abs=1e-12)
    # identical anchors always share a group; groups never cross task groups
    out = adv(
        "gigpo",
        [0, 0, 1, 1],
        t,
        s,
        [1.0, 0.0, 1.0, 0.0],
        anchors=[A, B, A, C],
        std_norm=False,
        similarity_threshold=0.9,
    )
    # group 0: A_ep [.5, -.5], step {A, B}: [.5, -.5]; group 1: A_ep [.5, -.5], A and C separate
    assert out == approx([1.0, -1.0, 0.5, -0.5], abs=1e-12)


def test_gigpo_unhashable_and_integer_anchors():
    out_list = adv(
        "gigpo",
        GIG["g"],
        GIG["t"],
        GIG["s"],
        GIG["r"],
        gamma=0.5,
        eps=0.0,
        anchors=[[0, 1], [1], [0, 1], [0, 1], {"x": 2}],
    )
    out_int = adv(
        "gigpo", GIG["g"], GIG["t"], GIG["s"], GIG["r"], gamma=0.5, eps=0.0, anchors=[10, 11, 10, 10, 12]
    )
    expected = [0.12975651199, 0.70710678119, 1.86180732308, -1.28445705037, -0.70710678119]
    assert out_list == approx(expected)
    assert out_int == approx(expected)


# ----------------------------------------------------------------------------------------------------------- #
# SLEA-RL                                                                                                      #
# ----------------------------------------------------------------------------------------------------------- #


def test_slea_clusters_with_unclustered_rows():
    # group 0, gamma .5:
    #   A: clusters [5, 7, -1], rewards [0, 0, 1] -> R^ [.25, .5, 1], R_A = 1
    #   B: clusters [5, -1, 7], rewards [0, 0, 0] -> R^ [0, 0, 0],    R_B = 0
    # std off: A_ep = ±.5; cluster 5 {A0 .25, B0 0} -> ±.125; cluster 7 {A1 .5, B2 0} -> ±.25;
    # the two -1 rows are NOT grouped together: 0.
    # group 1: one trajectory in cluster 5 (same id, another task group): everything 0.
    g = [0, 0, 0, 0, 0, 0, 1]
    t = [0, 0, 0, 1, 1, 1, 0]
    s = [0, 1, 2, 0, 1, 2, 0]
    r = [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 3.0]
    c = [5, 7, -1, 5, -1, 7, 5]
    out = adv("slea", g, t, s, r, clusters=c, gamma=0.5, std_norm=False)
    assert out == approx([0.625, 0.75, 0.5, -0.625, -0.5, -0.75, 0.0], abs=1e-12)
    # std on: each 2-member step group has |dev| / std = (d) / (sqrt(2) d) = 0.70710678; A_ep = ±0.70710678
    out = adv("slea", g, t, s, r, clusters=c, gamma=0.5, eps=0.0)
    h = 0.7071067811865476
    assert out == approx([2 * h, 2 * h, h, -2 * h, -h, -2 * h, 0.0])
    # with every row unclustered, SLEA = GRPO
    assert adv("slea", g, t, s, r, clusters=[-1] * 7) == approx(adv("grpo", g, t, s, r), abs=1e-15)


def test_slea_equals_gigpo_when_clusters_are_exact_anchors():
    c = [0, 1, 0, 0, 2]
    a = adv("slea", GIG["g"], GIG["t"], GIG["s"], GIG["r"], clusters=c, gamma=0.5)
    b = _gig()
    assert a == approx(b, abs=1e-15)


# ----------------------------------------------------------------------------------------------------------- #
# randomized: vectorised vs a naive per-row reference written here                                             #
# ----------------------------------------------------------------------------------------------------------- #


def _naive_norm(vals, std_norm, eps):
    if len(vals) < 2:
        return [0.0] * len(vals)
    m = sum(vals) / len(vals)
    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1))
    if not std_norm:
        return [v - m for v in vals]
    return [0.0 if sd == 0 else (v - m) / (sd + eps) for v in vals]


def _naive(
    name, g, t, s, r, anchors=None, clusters=None, gamma=0.95, w=1.0, std_norm=True, eps=1e-6, cross=False
):
    n = len(r)
    rows_of = defaultdict(list)
    for i in range(n):
        rows_of[(g[i], t[i])].append(i)
    R = {k: sum(r[i] for i in idx) for k, idx in rows_of.items()}
    disc = [0.0] * n
    for idx in rows_of.values():  # per row: Σ_{k ≥ t} γ^{k-t} r_k, directly from the definition
        idx = sorted(idx, key=lambda i: s[i])
        for p, i in enumerate(idx):
            disc[i] = sum(gamma ** (q - p) * r[idx[q]] for q in range(p, len(idx)))
    ep = [0.0] * n
    by_group = defaultdict(list)
    if cross:
        for i in range(n):
            by_group[g[i]].append(i)
        for idx in by_group.values():
            for i, a in zip(idx, _naive_norm([R[(g[i], t[i])] for i in idx], std_norm, eps), strict=True):
                ep[i] = a
    else:
        for k in R:
            by_group[k[0]].append(k)
        for keys in by_group.values():
            for k, a in zip(keys, _naive_norm([R[k] for k in keys], std_norm, eps), strict=True):
                for i in rows_of[k]:
                    ep[i] = a
    if name == "grpo":
        return ep
    groups = defaultdict(list)
    for i in range(n):
        key = (
            (g[i], anchors[i])
            if name == "gigpo"
            else ((g[i], clusters[i]) if clusters[i] != -1 else ("-1", i))
        )
        groups[key].append(i)
    out = list(ep)
    for idx in groups.values():
        for i, a in zip(idx, _naive_norm([disc[i] for i in idx], std_norm, eps), strict=True):
            out[i] += w * a
    return out


def _random_batch(rng, n_groups):
    g, t, s, r, a, c = [], [], [], [], [], []
    for grp in range(n_groups):
        for tr in range(int(rng.integers(1, 6))):
            length = int(rng.integers(1, 9))
            steps = rng.permutation(length) * 2 + 3  # gaps and an offset in the step numbers
            for k in steps:
                g.append(grp * 10)
                t.append(tr)
                s.append(int(k))
                r.append(float(rng.choice([0.0, 0.0, 1.0, -0.5, 10.0])))
                a.append(f"obs {int(rng.integers(0, 4))}")
                c.append(int(rng.integers(-1, 3)))
    perm = rng.permutation(len(g))
    return [np.asarray(x)[perm] for x in (g, t, s, r)] + [
        np.asarray(a, dtype=object)[perm],
        np.asarray(c)[perm],
    ]


@pytest.mark.parametrize("seed", range(4))
def test_randomized_against_naive(seed):
    rng = np.random.default_rng(seed)
    g, t, s, r, a, c = _random_batch(rng, 12)
    lists = [x.tolist() for x in (g, t, s, r, a, c)]
    for std_norm in (True, False):
        for gamma in (0.95, 0.5):
            kw = {"gamma": gamma, "std_norm": std_norm}
            got = compute_advantages("gigpo", g, t, s, r, anchors=a, step_weight=0.7, **kw)
            want = _naive("gigpo", *lists[:4], anchors=lists[4], w=0.7, **kw)
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
            got = compute_advantages("gigpo", g, t, s, r, anchors=a, cross_step_stats=True, **kw)
            want = _naive("gigpo", *lists[:4], anchors=lists[4], cross=True, **kw)
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
            got = compute_advantages("slea", g, t, s, r, clusters=c, **kw)
            want = _naive("slea", *lists[:4], clusters=lists[5], **kw)
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
        got = compute_advantages("grpo", g, t, s, r, std_norm=std_norm)
        np.testing.assert_allclose(got, _naive("grpo", *lists[:4], std_norm=std_norm), rtol=1e-9, atol=1e-9)
    # discounted returns (trajectory = (group, traj) pair)
    keys = [f"{gi}/{ti}" for gi, ti in zip(lists[0], lists[1], strict=True)]
    got = discounted_returns(np.asarray(keys, dtype=object), s, r, 0.9)
    want = [0.0] * len(r)
    for k in set(keys):
        idx = sorted((i for i in range(len(r)) if keys[i] == k), key=lambda i: lists[2][i])
        for p, i in enumerate(idx):
            want[i] = sum(0.9 ** (q - p) * lists[3][idx[q]] for q in range(p, len(idx)))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_large_batch_gives_finite_advantages():
    """A 20k-row batch (800 trajectories, 300 anchor states) goes through GiGPO whole (its speed is the
    benchmark's to measure, not a unit test's)."""
    rng = np.random.default_rng(0)
    n_traj = 800
    lengths = rng.integers(5, 50, n_traj)
    t = np.repeat(np.arange(n_traj), lengths)
    g = t // 8
    s = np.concatenate([np.arange(k) for k in lengths])
    r = (rng.random(len(t)) < 0.05).astype(float)
    anchors = np.asarray([f"state {x}" for x in rng.integers(0, 300, len(t))], dtype=object)
    out = compute_advantages("gigpo", g, t, s, r, anchors=anchors)
    assert out.shape == (len(t),) and np.all(np.isfinite(out))
