"""The power simulation of the exact sign-flip test (slea.evaluation.power), on cases computed by hand."""

import itertools
import math

import numpy as np
import pytest

from slea.evaluation import power as P
from slea.evaluation.stats import sign_flip_pvalue


def _brute(diffs):
    d = [x for x in diffs if x != 0]
    obs = abs(sum(d))
    hits = sum(abs(sum(s * x for s, x in zip(signs, d))) >= obs - 1e-12 for signs in itertools.product((1, -1),
                                                                                                       repeat=len(d)))
    return hits / 2 ** len(d)


def test_exact_pvalue_by_hand():
    assert P.exact_sign_flip_pvalue([0.1] * 6) == pytest.approx(2 / 64)  # all positive: 2 of 64 assignments
    assert P.exact_sign_flip_pvalue([0.1] * 6 + [0.0] * 10) == pytest.approx(2 / 64)  # zeros flip onto themselves
    assert P.exact_sign_flip_pvalue([1, 2, -3, 4]) == pytest.approx(10 / 16)
    assert P.exact_sign_flip_pvalue([0, 0]) == 1.0 and P.exact_sign_flip_pvalue([]) == 1.0
    assert P.exact_sign_flip_pvalue([1, -1]) == 1.0  # observed sum 0: every assignment is as extreme


def test_exact_pvalue_against_brute_force_and_scipy():
    rng = np.random.default_rng(3)
    for _ in range(60):
        n = int(rng.integers(1, 11))
        d = list(np.round(rng.normal(0.02, 0.05, n) * 64) / 64 * (rng.random(n) < 0.7))
        assert P.exact_sign_flip_pvalue(d) == pytest.approx(_brute(d), abs=1e-12)
        assert P.exact_sign_flip_pvalue(d) == pytest.approx(sign_flip_pvalue(d)[0], abs=1e-12)


def test_exact_pvalue_beyond_what_scipy_enumerates():
    d = [1 / 64] * 30  # 30 nonzero, all positive: 2 / 2^30, which only the meet-in-the-middle count gets exactly
    assert P.exact_sign_flip_pvalue(d) == pytest.approx(2 / 2 ** 30, rel=1e-9)
    with pytest.raises(ValueError, match="at most"):
        P.exact_sign_flip_pvalue([1.0] * (P.MAX_NONZERO + 1))


def test_power_of_an_all_positive_pilot_is_a_step():
    # every simulated study is all positive, so p = 2 / 2^n: below 0.05 from 6 seeds on, never before
    pilot = [0.05, 0.1, 0.2]
    assert P.sign_flip_power(pilot, 5, n_sims=200).power == 0.0
    assert P.sign_flip_power(pilot, 6, n_sims=200).power == 1.0
    n, curve = P.seeds_for_power(pilot, n_sims=200)
    assert n == 6 and [r.n for r in curve] == [1, 2, 3, 4, 5, 6] and curve[-1].stderr == 0.0


def test_power_of_a_half_zero_pilot_is_a_binomial_tail():
    # pilot (1, 0): a study of n seeds passes iff at least 6 of them drew the 1, so power = P(Binomial(n, 1/2) >= 6)
    n = 8
    by_hand = sum(math.comb(n, k) for k in range(6, n + 1)) / 2 ** n  # 37 / 256
    r = P.sign_flip_power([1.0, 0.0], n, n_sims=20_000, seed=1)
    assert abs(r.power - by_hand) < 4 * math.sqrt(by_hand * (1 - by_hand) / 20_000)


def test_a_baseline_that_scores_lowers_power():
    # pilot all +1, the baseline scores 1 on a seed with probability 1/2: that seed's difference is 0, so a study
    # of 6 passes only if no seed was scored on: power = (1/2)^6
    r = P.sign_flip_power([1.0], 6, loss_rate=0.5, baseline_scores=[1.0], n_sims=20_000, seed=2)
    assert abs(r.power - 1 / 64) < 4 * math.sqrt((1 / 64) * (63 / 64) / 20_000)
    with pytest.raises(ValueError, match="probability"):
        P.sign_flip_power([1.0], 6, loss_rate=1.5)


def test_power_is_reproducible_from_its_seed():
    pilot = [3 / 64, 0, 4 / 64, 0, 0, 0, 0, 8 / 64]
    a = P.sign_flip_power(pilot, 12, loss_rate=1 / 8, baseline_scores=[1 / 64], n_sims=500, seed=7)
    b = P.sign_flip_power(pilot, 12, loss_rate=1 / 8, baseline_scores=[1 / 64], n_sims=500, seed=7)
    assert a == b
