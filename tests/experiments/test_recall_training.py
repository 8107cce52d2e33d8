"""experiments/recall_training.py: Holm's adjustment and the per-run summaries by hand, then the committed summary and
docs/results/control_recall.md against what the script makes of the committed Recall runs (nothing is trained)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slea.testing.bench import load_script

REPO = Path(__file__).resolve().parents[2]
T = load_script(REPO / "experiments" / "recall_training.py")
PAGE = REPO / "docs" / "results" / "control_recall.md"


def test_holm_adjusts_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04: × 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 → running max 0.02, 0.03, 0.06, 0.06
    assert T.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert T.holm([0.5, 0.6]) == [1.0, 1.0]  # 0.5 × 2 caps at 1, and the larger raw p cannot fall below it
    assert T.holm([0.2]) == [0.2]
    # the entropy bonus's four exact p (8/256, 2/256, 20/256, 156/256): only 2/256 × 4 = 0.031 stays below 0.05
    assert T.holm([8 / 256, 2 / 256, 20 / 256, 156 / 256]) == pytest.approx([0.09375, 0.03125, 0.15625, 0.609375])


def test_quiet_counts_the_iterations_with_no_update():
    rows = [{"iteration": i, "adv/abs_mean": a, "train/invalid_rate": v, "train/success": 0.0,
             "time/iteration_s": t, "library/size_pos": n}
            for i, (a, v, t, n) in enumerate([(1.2, 0.5, 40.0, 2), (0.4, 0.1, 20.0, 3), (0.0, 0.0, 1.5, 3),
                                              (0.3, 0.02, 9.0, 4), (0.0, 0.0, 2.2, 4)])]
    q = T.quiet(rows, start=2)
    assert q["no_update"] == [2, 4] and q["iterations"] == 3 and q["no_update_s"] == [1.5, 2.2]
    assert q["invalid_max"] == 0.02 and q["first_iteration_s"] == 40.0 and q["strategies"] == [2, 3, 3, 4, 4]
    assert T.quiet([{**r, "adv/abs_mean": 1.0} for r in rows], start=2)["no_update_s"] is None


def test_a_missing_study_is_one_line_and_exit_code_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        T.main([], root=tmp_path)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no run folders" in err and "eight_seeds" in err


@pytest.fixture(scope="module")
def remade(tmp_path_factory):
    """The script's output made from the committed runs (written to a scratch folder, the runs read in place)."""
    out = tmp_path_factory.mktemp("recall")
    made = {"bonus": T.bonus(), "seed0": T.seed0(), "heldout_wins": T.heldout_wins(), "three_seed": T.three_seed()}
    (out / "training.md").write_text(T.markdown(*made.values()))
    return made, (out / "training.md").read_text()


def test_the_committed_summary_is_what_the_script_makes_of_the_committed_runs(remade):
    made, md = remade
    assert json.loads(json.dumps(made)) == json.loads((T.RESULTS / "training.json").read_text())
    assert md == (T.RESULTS / "training.md").read_text()


def test_the_page_quotes_the_remade_summary(remade):
    made, _ = remade
    page = " ".join(PAGE.read_text().split())
    ent = {t["b"]: t for t in made["bonus"]["signals"]["rollout/entropy"]["tests"]}
    assert [round(ent[a]["p_holm"], 3) for a in ("slea_task", "slea", "grpo", "gigpo")] == [0.031, 0.094, 0.156, 0.609]
    assert "Holm-Bonferroni over the four (family-wise α = 0.05): slea_task 0.031, slea 0.094, grpo 0.16, gigpo 0.61" \
        in page
    for arm, text in (("slea", "slea +0.29 ± 0.47 (p = 0.031, CI [+0.03, +0.61])"),
                      ("grpo", "grpo +0.48 ± 0.74 (p = 0.078, CI [+0.08, +1.01])")):
        t = ent[arm]
        assert f"{arm} {t['mean']:+.2f} ± {t['std']:.2f} (p = {t['p']:.3f}, CI [{t['ci'][0]:+.2f}, {t['ci'][1]:+.2f}])" \
            == text and text in page
    assert sum(d > 0 for d in ent["slea_task"]["diffs"]) == 8 and sum(d > 0 for d in ent["slea"]["diffs"]) == 6
    eq = {t["b"]: round(t["p_holm"], 2) for t in made["bonus"]["signals"]["collapse/equal_return_frac"]["tests"]}
    assert (eq["slea"], eq["grpo"], eq["slea_task"], eq["gigpo"]) == (0.75, 0.38, 1.0, 1.0)
    assert "(Holm p 0.75, 0.38, 1.0, 1.0)" in page
    # seed 0: grpo's entropy is 0.50 at iteration 7 and 0.10 at its lowest, at iteration 11; the others 0.02-0.08
    s0 = made["seed0"]
    assert round(s0["grpo"]["at_settled"], 2) == 0.50 and [round(s0["grpo"]["lowest_late"][0], 2),
                                                          s0["grpo"]["lowest_late"][1]] == [0.10, 11]
    others = [s0[a]["at_settled"] for a in ("slea", "slea_task", "slea_off", "gigpo")]
    assert (round(min(others), 2), round(max(others), 2)) == (0.02, 0.08)
    assert "0.02-0.08 by iteration 7 in slea, slea_task, slea_off and gigpo" in page
    assert "0.50 at iteration 7, 0.10-0.50 over iterations 6-11, and 0.10 only at iteration 11" in page
    # the held-out wins are slea's only: 15 episodes on 3 seeds in the first 8-seed run
    wins = made["heldout_wins"]["eight_seeds"]
    assert wins["slea"] == [3, 0, 4, 0, 0, 0, 0, 8] and all(sum(w) == 0 for a, w in wins.items() if a != "slea")
    assert "15 episodes on 3 seeds (3, 4 and 8 of 64 on seeds 0, 2 and 7" in page
    # the 3-seed runs: iterations with no update, from iteration 5 (lr 3e-4) and 6 (lr 1.5e-4)
    lr3, lr15 = made["three_seed"]["lr3e-4"], made["three_seed"]["lr1.5e-4"]
    base = [f"{a}-s{s}" for a in ("grpo", "gigpo") for s in range(3)]
    assert sum(len(lr3[r]["no_update"]) for r in base) == 38 and sum(lr3[r]["iterations"] for r in base) == 42
    assert sum(len(lr15[r]["no_update"]) for r in base) == 28 and sum(lr15[r]["iterations"] for r in base) == 36
    assert "38 of the 42 iterations of their 6 runs have zero advantage" in page and "in 28 of the 36 iterations" in page
    assert lr3["slea-s2"]["no_update"] == list(range(5, 11)) and lr3["slea-s2"]["strategies"][:8] == [5] * 7 + [7]
    assert [lr3[f"slea-s{s}"]["strategies"][6] for s in (0, 1)] == [14, 13]
    assert lr15["slea-s0"]["no_update"] == [8, 9, 10, 11] and lr15["slea-s2"]["no_update"] == [8, 9, 10]
    assert lr15["slea-s1"]["no_update"] == [] and round(lr15["slea-s1"]["success_max"], 2) == 0.44
    secs = [x for r in base for x in lr3[r]["no_update_s"]]
    first = [lr3[r]["first_iteration_s"] for r in base]
    assert f"takes {min(secs):.1f}-{max(secs):.1f} s against {min(first):.0f}-{max(first):.0f} s" in page
    assert "episodes.jsonl" not in page.split("## The powered study")[0]  # no figure rests on an untracked file
