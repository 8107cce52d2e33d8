"""experiments/control_team.py's reading of the runs: the team return before and after every single-member update,
the regressions counted from them, and the test that compares two variants' regression counts (no model)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from slea.testing.bench import load_script

S = load_script(Path(__file__).resolve().parents[2] / "experiments" / "control_team.py")


def _row(stage, position, before, after=None, probe=None):
    row = {"stage": stage, "position": position, "team/return_before": before}
    if after is not None:
        row["team/return_after"] = after
    if probe is not None:
        row["probe/return_after"] = probe
    return row


def test_update_returns_chain_within_a_stage_and_restart_at_the_next():
    # fresh rows carry the return after; a stale stage's last update has no probe (the next stage collects anew)
    rows = [_row(0, 0, 0.2, after=0.3), _row(0, 1, 0.3, after=0.25), _row(1, 0, 0.4, probe=0.5), _row(1, 1, 0.4)]
    pairs = S.update_returns(rows)
    assert pairs[:3] == [(0.2, 0.3), (0.3, 0.25), (0.4, 0.5)]
    assert pairs[3][0] == 0.5 and math.isnan(pairs[3][1])


def test_regressions_count_only_drops_and_leave_out_missing_returns():
    pairs = [(0.2, 0.3), (0.3, 0.25), (0.25, 0.25), (0.5, math.nan), (0.6, 0.1)]
    assert S.regression_count(pairs) == (2, 4)  # an equal return is not a regression
    assert S.regression_count([(0.1, math.nan)]) == (0, 0)


def test_fisher_exact_against_hand_computed_tables():
    # Fisher's tea-tasting table (3 of 4 against 1 of 4): the hypergeometric probabilities of 0..4 are
    # 1, 16, 36, 16, 1 over 70, and the tables no more likely than 16/70 sum to 34/70
    assert S.fisher_exact(3, 4, 1, 4) == pytest.approx(34 / 70)
    assert S.fisher_exact(1, 4, 3, 4) == pytest.approx(34 / 70)
    # 0 of 10 against 10 of 10: only the two extreme tables, each 1 / C(20, 10)
    assert S.fisher_exact(0, 10, 10, 10) == pytest.approx(2 / math.comb(20, 10))
    assert S.fisher_exact(5, 16, 5, 16) == pytest.approx(1.0)


def test_pooled_regressions_and_paired_differences():
    runs = [{"seed": 0, "update_regression_count": (5, 16), "heldout_return": 0.5},
            {"seed": 1, "update_regression_count": (7, 16), "heldout_return": 0.25}]
    base = {0: {"heldout_return": 0.375}, 1: {"heldout_return": 0.375}, 2: {"heldout_return": 0.9}}
    assert S.pooled_regressions(runs) == (12, 32)
    # +0.125 and -0.125 (seed 2 has no run): mean 0, sample std 0.125·√2 = 0.177; one sign of each: p = 1
    c = S._paired(runs, base, "heldout_return", "naive")
    assert c.seeds == (0, 1) and c.diffs == pytest.approx((0.125, -0.125)) and c.mean == pytest.approx(0.0)
    assert c.std == pytest.approx(0.125 * math.sqrt(2)) and c.p == 1.0 and c.p_min == 0.5 and c.ci_method == "seeds"
    assert S._diff_cell(c) == "+0.000 ± 0.177 (p = 1.000)"
    # success pairs game by game where both runs stored their per-game wins
    runs = [{"seed": 0, "heldout_success": 0.5, "heldout_games": [1.0, 0.0]}]
    base = {0: {"heldout_success": 0.0, "heldout_games": [0.0, 0.0]}}
    assert S._paired(runs, base, "heldout_success").ci_method == "seeds, then games"


def test_stage_drifts_measure_each_intermediate_team_against_the_stages_first_collection():
    rows = [_row(0, 0, 0.25, probe=0.5), _row(0, 1, 0.25, probe=0.0), _row(0, 2, 0.25),  # a stale stage
            _row(1, 1, 0.5, after=0.75), _row(1, 0, 0.5, after=0.5)]  # fresh, rows out of order
    # stage 0: the teams after updates 0 and 1 against 0.25; stage 1: after update 0 (0.5) against 0.5
    assert S.stage_drifts(rows) == [0.25, -0.25, 0.0]


def test_the_probing_trainer_plays_the_intermediate_team_after_a_stale_update(tmp_path):
    # the tiny model on the TeamTR smoke preset, one stage of two updates: in the stale mode the first update's row
    # gets the probe's return (the team plays again only after the stage's last update), fresh rows never do
    pytest.importorskip("textworld")
    from slea.config import load_config

    root = Path(__file__).resolve().parents[2]
    over = ["rollout.groups=1", "team.max_turns=2", "team.trust_region.min_steps=1", "team.trust_region.max_steps=1",
            "train.iterations=1", "run.threads=1", "eval.before=false", "eval.games=1", "eval.episodes_per_game=1"]
    rows = {}
    for mode in ("stale", "fresh"):
        cfg = load_config(root / "configs/teamtr_smoke.yaml", [*over, f"team.rollouts={mode}"])
        trainer = S.probing_trainer(cfg, tmp_path / mode)
        try:
            trainer.fit()
        finally:
            trainer.close()
        rows[mode] = S.read_metrics(tmp_path / mode / "metrics.jsonl")
    assert [("probe/return_after" in r, "team/return_after" in r) for r in rows["stale"]] == [(True, False),
                                                                                             (False, True)]
    assert not any("probe/return_after" in r for r in rows["fresh"])
