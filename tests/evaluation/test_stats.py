"""The paired statistics of a comparison, against hand-computed cases and against scipy."""

import itertools
import json

import numpy as np
import pytest

from slea.evaluation import stats as S


def _enumerated_p(diffs):
    """Independent of scipy: the fraction of all 2^n sign assignments with |mean| >= |observed mean|."""
    d = np.asarray(diffs, dtype=float)
    obs = abs(d.mean())
    hits = [abs((np.array(signs) * d).mean()) >= obs - 1e-12 for signs in itertools.product((1, -1), repeat=d.size)]
    return sum(hits) / len(hits)


def test_eight_seeds_all_positive_reach_two_in_256():
    p, exact = S.sign_flip_pvalue([0.1, 0.2, 0.05, 0.3, 0.1, 0.4, 0.2, 0.15])
    # only the observed signs and their mirror image are as extreme: 2 of 2^8
    assert exact and p == pytest.approx(2 / 256)
    assert S.min_sign_flip_pvalue(8) == pytest.approx(2 / 256)
    c = S.paired_comparison({s: 0.5 + 0.01 * s for s in range(8)}, {s: 0.4 for s in range(8)})
    assert c.p == pytest.approx(2 / 256) and c.separated and c.verdict == "separated"


def test_three_seeds_cannot_go_below_a_quarter():
    assert S.min_sign_flip_pvalue(3) == 0.25
    p, exact = S.sign_flip_pvalue([0.3, 0.5, 0.9])  # all positive: the best 3 seeds can do
    assert exact and p == pytest.approx(0.25)
    c = S.paired_comparison({0: 0.9, 1: 0.8, 2: 1.0}, {0: 0.1, 1: 0.0, 2: 0.2})
    assert c.p == pytest.approx(0.25) and c.p_min == 0.25 and not c.separated and c.verdict == "not separated"
    # 6 seeds is the fewest that can reach p < 0.05
    assert S.min_sign_flip_pvalue(5) > 0.05 > S.min_sign_flip_pvalue(6) == pytest.approx(2 / 64)
    assert S.min_sign_flip_pvalue(1) == 1.0 and S.min_sign_flip_pvalue(0) is None


def test_mixed_signs_enumerated_by_hand():
    # |d| = 1, 2, 3, 4 (total 10), observed sum 1 + 2 - 3 + 4 = 4. Flipping the set N of values gives the sum
    # 10 - 2·sum(N); |sum| >= 4 when sum(N) <= 3 ({}, {1}, {2}, {3}, {1,2}: 5 sets) or sum(N) >= 7 ({3,4}, {1,2,4},
    # {1,3,4}, {2,3,4}, {1,2,3,4}: 5 sets): 10 of 16
    p, exact = S.sign_flip_pvalue([1, 2, -3, 4])
    assert exact and p == pytest.approx(10 / 16) == _enumerated_p([1, 2, -3, 4])
    # a zero difference flips to itself: (+0.625, +0.188, 0) is as extreme with either sign of the 0, and with
    # the two non-zero signs flipped together: 4 of 8 (the Recall control's slea − grpo)
    assert S.sign_flip_pvalue([0.625, 0.188, 0.0])[0] == pytest.approx(0.5)
    assert S.sign_flip_pvalue([-0.047, 0.125, 0.156])[0] == pytest.approx(0.5)  # TextWorld default, slea − grpo
    assert S.sign_flip_pvalue([0.0, 0.359, 0.0])[0] == pytest.approx(1.0)
    # no difference, and one seed: p = 1; no seed: None
    assert S.sign_flip_pvalue([0.0, 0.0, 0.0]) == (1.0, True)
    assert S.sign_flip_pvalue([0.3]) == (1.0, True)
    assert S.sign_flip_pvalue([]) == (None, False)


def test_sign_flip_matches_a_plain_enumeration():
    rng = np.random.default_rng(3)
    for n in (2, 4, 7, 10):
        d = np.round(rng.normal(0.05, 0.2, n), 3)
        assert S.sign_flip_pvalue(d)[0] == pytest.approx(_enumerated_p(d))


def test_many_seeds_are_sampled_not_enumerated():
    d = np.linspace(0.01, 0.3, 22)  # 2^22 assignments: sampled, from a fixed seed
    p, exact = S.sign_flip_pvalue(d, n_resamples=20_000)
    assert not exact and p < 1e-3 and S.sign_flip_pvalue(d, n_resamples=20_000)[0] == p


def test_bootstrap_ci_of_equal_differences_is_a_point():
    assert S.hierarchical_bootstrap_ci([[0.25] * 8] * 5) == (0.25, 0.25)
    assert S.seed_bootstrap_ci([0.25] * 5) == (0.25, 0.25)
    c = S.paired_comparison({s: 0.75 for s in range(4)}, {s: 0.5 for s in range(4)},
                            a_games={s: [1.0, 0.5] for s in range(4)}, b_games={s: [0.75, 0.25] for s in range(4)})
    assert c.ci == pytest.approx((0.25, 0.25)) and c.ci_method == "seeds, then games" and c.games == 2
    assert S.hierarchical_bootstrap_ci([]) is None and S.seed_bootstrap_ci([]) is None


def test_one_level_case_agrees_with_scipy_bootstrap():
    from scipy import stats

    v = np.random.default_rng(0).normal(0.1, 0.3, 12)
    ours = S.hierarchical_bootstrap_ci([[x] for x in v], n_resamples=40_000)  # one game per seed: seeds only
    theirs = stats.bootstrap((v,), np.mean, method="percentile", n_resamples=40_000,
                             rng=np.random.default_rng(1)).confidence_interval
    assert ours == pytest.approx((theirs.low, theirs.high), abs=0.01)
    assert S.seed_bootstrap_ci(v, n_resamples=40_000) == pytest.approx((theirs.low, theirs.high), abs=0.01)
    # one seed: the hierarchical bootstrap is the bootstrap over that seed's games
    g = np.random.default_rng(2).integers(0, 2, 32).astype(float)
    ours = S.hierarchical_bootstrap_ci([g], n_resamples=40_000)
    theirs = stats.bootstrap((g,), np.mean, method="percentile", n_resamples=40_000,
                             rng=np.random.default_rng(1)).confidence_interval
    assert ours == pytest.approx((theirs.low, theirs.high), abs=0.02)


def test_games_widen_the_interval_that_seeds_alone_call_a_point():
    games = [[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]]  # every seed's mean is 0.5
    lo, hi = S.hierarchical_bootstrap_ci(games)
    assert lo < 0.5 < hi and S.seed_bootstrap_ci([0.5, 0.5, 0.5]) == (0.5, 0.5)
    # ragged seeds: each drawn seed resamples its own games
    lo, hi = S.hierarchical_bootstrap_ci([[1.0], [0.0, 0.0, 0.0]])
    assert lo == 0.0 and hi == 1.0
    # the same seed gives the same interval
    assert S.hierarchical_bootstrap_ci(games) == S.hierarchical_bootstrap_ci(games)


def test_paired_comparison_pairs_seeds_and_reports_everything():
    a = {0: 0.625, 1: 0.188, 2: 0.0, 3: 0.5}
    b = {0: 0.0, 1: 0.0, 2: 0.0, 4: 0.1}  # seed 3 and 4 are not paired
    c = S.paired_comparison(a, b, names=("slea", "grpo"))
    assert c.seeds == (0, 1, 2) and c.diffs == pytest.approx((0.625, 0.188, 0.0)) and c.n == 3
    assert c.mean == pytest.approx(0.271, abs=1e-3) and c.std == pytest.approx(np.std([0.625, 0.188, 0], ddof=1))
    assert c.p == pytest.approx(0.5) and c.p_min == 0.25 and c.ci_method == "seeds" and not c.separated
    assert c.ci[0] == pytest.approx(0.0) and c.ci[1] == pytest.approx(0.625)
    d = json.loads(json.dumps(c.to_dict()))
    assert d["n"] == 3 and d["verdict"] == "not separated" and d["p_min"] == 0.25
    line = S.summary_line(c)
    assert "n=3" in line and "p = 0.500" in line and "smallest possible 0.250" in line and "95% CI [" in line
    assert line.endswith("not separated") and S.summary_line(d) == line
    md = S.markdown_table([c, d])
    assert md.count("| slea − grpo | 3 | s0 +0.625, s1 +0.188, s2 +0.000 | +0.271 ± 0.321 | 0.500 | 0.250 |") == 2
    # games of different lengths cannot pair game by game: the interval is over seeds
    c = S.paired_comparison({0: 1.0, 1: 0.5}, {0: 0.0, 1: 0.0}, a_games={0: [1.0], 1: [0.5, 0.5]},
                            b_games={0: [0.0, 0.0], 1: [0.0, 0.0]})
    assert c.ci_method == "seeds"
    empty = S.paired_comparison({0: 1.0}, {1: 0.0})
    assert empty.n == 0 and empty.p is None and empty.ci is None and not empty.separated
    assert "no paired seeds" in S.summary_line(empty)


def test_per_game_success_from_an_evaluation_result():
    res = {"games": 4, "sampled": {"episodes": 8.0, "success": 0.625}, "per_game_wins": [2, 1, 0, 2]}
    assert S.per_game_success(res) == [1.0, 0.5, 0.0, 1.0]
    assert np.mean(S.per_game_success(res)) == res["sampled"]["success"]
    assert S.per_game_success({"sampled": {"success": 0.5}}) is None and S.per_game_success(None) is None


def test_format_p():
    assert S.format_p(2 / 256) == "0.0078" and S.format_p(0.5) == "0.500" and S.format_p(None) == "–"
