"""The adequacy histogram (tlm-DRE Fig. 5) and the suggested pivot."""

from __future__ import annotations

import numpy as np
import pytest

from slea.alignment.pivot import adequacy_histogram, suggest_pivot


def test_otsu_by_hand():
    # 4 bins on [0, 1] (centers .125 .375 .625 .875); p = three at .1, one at .4, four at .9
    # w = [3/8, 1/8, 0, 1/2], overall mean mu = (3*.125 + .375 + 4*.875)/8 = .53125
    # between-class variance (mu*W - M)^2 / (W (1 - W)) for a split after bin k (W, M cumulative):
    #   k=0: W=.375, M=.046875 -> (.19921875 - .046875)^2 / .234375 = .0990
    #   k=1: W=.5,   M=.09375  -> (.265625 - .09375)^2 / .25       = .1182
    #   k=2: the same partition as k=1 (bin 2 is empty)            = .1182
    # best splits k in {1, 2}: the lower middle, k=1 -> pivot = right edge of bin 1 = .5
    p = np.array([0.1, 0.1, 0.1, 0.4, 0.9, 0.9, 0.9, 0.9])
    assert suggest_pivot(p, bins=4) == 0.5


def test_an_empty_stretch_between_modes_gives_its_middle():
    # bins of width .25: modes in bin 0 and bin 3; splits after bins 0, 1, 2 are equal -> k=1 -> .5
    assert suggest_pivot(np.array([0.1, 0.1, 0.9]), bins=4) == 0.5


def test_one_occupied_bin_falls_back_to_the_paper_and_bad_input_is_an_error():
    assert suggest_pivot(np.full(10, 0.95)) == 0.9
    with pytest.raises(ValueError, match="empty"):
        suggest_pivot(np.array([]))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        suggest_pivot(np.array([0.5, 1.5]))


def test_histogram_on_a_synthetic_failure_set(tmp_path):
    rng = np.random.default_rng(0)
    # 300 confident turns (p in [.93, 1)) and 150 uncertain ones (p in [.2, .7)), as token log-probs:
    # a turn of n tokens each at log p has Eq.9 adequacy exactly p
    p_true = np.concatenate([rng.uniform(0.93, 1.0, 300), rng.uniform(0.2, 0.7, 150)])
    turns = [np.full(rng.integers(1, 8), np.log(p)) for p in p_true]
    out = tmp_path / "adequacy.png"
    rep = adequacy_histogram(turns, out)
    assert 0.7 <= rep.pivot <= 0.93  # in the valley between the two groups
    assert rep.n_turns == 450
    assert rep.frac_confident == pytest.approx(300 / 450)
    assert rep.frac_confident_at_paper_pivot == pytest.approx(np.mean(p_true > 0.9))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    assert rep.path == str(out)
