"""experiments/state_key_gate.py: the gate's three conditions on hand-built figures, and a run's figures read from a
fake run folder (nothing is trained)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slea.testing.bench import load_script

G = load_script(Path(__file__).resolve().parents[2] / "experiments" / "state_key_gate.py")


def _fig(hit, right, size):
    return {"heldout_hit_rate": hit, "heldout_right_state": right, "train_step_group_size": size}


def test_gate_conditions_by_hand():
    raw = {s: _fig(0.05, 1.0, 1.2) for s in (0, 1, 2)}
    key = {0: _fig(0.8, 0.95, 3.0), 1: _fig(0.6, 0.92, 2.5), 2: _fig(0.7, 0.91, 2.6)}
    g = G.gate("gate_default", {"slea": raw, "slea_key": key})
    # step groups 2.7 vs 1.2: 2.25x
    assert g["passed"] and g["complete"] and g["step_group_size"]["key"] == pytest.approx(2.7)
    key[1] = _fig(0.49, 0.95, 2.5)  # one seed below the hit rate
    g = G.gate("gate_default", {"slea": raw, "slea_key": key})
    assert g["conditions"] == {"hit_rate": False, "right_state": True, "step_groups": True} and not g["passed"]
    key[1] = _fig(0.6, 0.89, 1.0)  # wrong kinds of state, and groups 2.2 / 1.2 < 2x
    g = G.gate("gate_default", {"slea": raw, "slea_key": key})
    assert g["conditions"] == {"hit_rate": True, "right_state": False, "step_groups": False}
    g = G.gate("gate_default", {"slea_key": key})  # no raw runs yet: nothing to compare the groups with
    assert not g["complete"] and not g["conditions"]["step_groups"]


def test_run_figures_read_a_run_folder(tmp_path):
    d = tmp_path / "slea-s0"
    (d / "eval").mkdir(parents=True)
    assert G.run_figures(d) is None
    sampled = {"success": 0.75, "retrieval_hit_rate": 0.6, "retrieval_right_state": 0.95, "lesson_followed": 0.5}
    (d / "eval" / "summary.json").write_text(json.dumps({"after": {"sampled": sampled}}))
    rows = [{"iteration": 0, "train/step_group_size": 2.0, "library/cluster_members": 3.0},
            {"iteration": 1, "train/step_group_size": 4.0, "library/cluster_members": 5.0,
             "library/cluster_singletons": 0.25}]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    f = G.run_figures(d)
    assert f["heldout_hit_rate"] == 0.6 and f["train_step_group_size"] == 3.0
    assert f["cluster_members"] == 5.0 and f["cluster_singletons"] == 0.25
