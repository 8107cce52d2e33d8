"""The default job's benches: bench/profile_iteration.py's prefill count and bench/prefix_job.py's per-token rates,
against counts by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from slea.testing.bench import load_script

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_prefill_positions_by_hand():
    """Distinct prompts A (22 tokens) and B (23) share their first 20 tokens, C (3) only the first 2, and A comes
    twice. The common prefix alone: 2 tokens, then 3 distinct rests padded to 21. The trie: a node of 20 tokens
    (shared by A and B: it saves 20 positions; the 2 shared by all save 4, under the threshold), then the rows'
    own tokens padded to 3 (A 2, B 3, C 3)."""
    P = load_script(BENCH / "profile_iteration.py")
    shared = list(range(1, 21))
    a, b, c = shared + [30, 31], shared + [40, 41, 42], [1, 2, 50]
    assert P.prefill_positions([a, b, a, c]) == {"calls": 1, "rows": 4, "distinct": 3, "tokens": 48,
                                                 "trie": 20 + 3 * 3, "common_prefix": 2 + 3 * 21}


def test_prefix_job_rates_skip_the_first_iteration():
    J = load_script(BENCH / "prefix_job.py")
    rows = [{"time/train_s": 99.0, "tokens/trained": 1, "time/generation_s": 99.0, "tokens/prompt": 1},
            {"time/train_s": 2.0, "update/old_logprobs_s": 0.5, "tokens/trained": 100, "time/generation_s": 4.0,
             "tokens/prompt": 1000, "time/iteration_s": 7.0},
            {"time/train_s": 3.0, "update/old_logprobs_s": 0.5, "tokens/trained": 150, "time/generation_s": 1.0,
             "tokens/prompt": 500, "time/iteration_s": 5.0}]
    r = J.rates(rows)
    assert r["iterations"] == 2 and r["train_s"] == 5.0 and r["old_logprobs_s"] == 1.0
    assert r["trained_tokens_per_train_s"] == pytest.approx(250 / 5.0)
    assert r["prompt_tokens_per_generation_s"] == pytest.approx(1500 / 5.0)
    assert J.rates([rows[0], {**rows[1], "time/train_s": 0.0}])["trained_tokens_per_train_s"] is None
