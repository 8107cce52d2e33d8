"""Merging an iteration's rounds (RTPO plays several): counts add up, the library's state is the last round's."""

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
