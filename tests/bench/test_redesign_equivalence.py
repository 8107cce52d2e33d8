"""bench/redesign_equivalence.py's comparison of two run folders, on hand-built folders (no training): what is
equal, what differs and where, and what is left out (wall times, the run's own path, TensorBoard files)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import torch
from safetensors.torch import save_file

from slea.testing.bench import load_script

E = load_script(Path(__file__).resolve().parents[2] / "bench" / "redesign_equivalence.py")

ROWS = [{"iteration": 0, "train/return": 0.25, "loss": 1.5, "time/iteration_s": 3.0, "throughput/tokens_per_s": 9.0,
         "library/evolve_s": 0.1},
        {"iteration": 1, "train/return": float("nan"), "loss": 1.25, "time/iteration_s": 2.0,
         "throughput/tokens_per_s": 8.0, "library/evolve_s": 0.2}]
EVAL = {"sampled": {"success": 0.5, "return": 0.2}, "per_game_wins": [1, 0], "wall_s": 8.9, "train_s": 7.5}
WEIGHTS = {"a.lora_A.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3),
           "a.lora_B.weight": torch.zeros(3, 2)}
LIBRARY = [(1, "go east", 0.5), (2, "take coin", 1.0)]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _write_library(path: Path, rows: list[tuple]) -> None:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE entries (id INTEGER PRIMARY KEY, text TEXT, score REAL)")
    con.executemany("INSERT INTO entries VALUES (?, ?, ?)", rows)
    con.commit()
    con.close()


def make_run(root: Path, *, rows=ROWS, ev=EVAL, weights=WEIGHTS, library=LIBRARY) -> Path:
    """A run folder with one file of each kind the comparison reads, plus an event file and a plot."""
    (root / "eval").mkdir(parents=True)
    (root / "checkpoints" / "iter_000001").mkdir(parents=True)
    (root / "events").mkdir()
    _write_jsonl(root / "metrics.jsonl", rows)
    _write_jsonl(root / "episodes.jsonl", [{"iteration": 0, "steps": [{"action": "go east", "reward": 0.0}]}])
    (root / "eval" / "after.json").write_text(json.dumps(ev))
    (root / "eval" / "summary.json").write_text(json.dumps({"run_dir": str(root), "after": ev}))
    save_file(weights, str(root / "checkpoints" / "iter_000001" / "trainable.safetensors"))
    (root / "checkpoints" / "iter_000001" / "manifest.json").write_text(
        json.dumps({"iteration": 0, "files": {"trainable.safetensors": {"sha256": str(root)}}}))
    _write_library(root / "library.sqlite", library)
    (root / "config.yaml").write_text(f"run:\n  dir: {root}\n  seed: 0\nmodel:\n  name_or_path: tiny\n")
    (root / "events" / f"events.out.tfevents.{root.name}").write_bytes(root.name.encode())
    (root / "curves.png").write_bytes(root.name.encode())
    return root


def test_two_runs_equal_but_for_their_clocks_and_paths_are_equal_file_by_file(tmp_path):
    rows = [{**r, "time/iteration_s": 99.0, "throughput/tokens_per_s": 1.0, "library/evolve_s": 7.0} for r in ROWS]
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b", rows=rows, ev={**EVAL, "wall_s": 1.0, "train_s": 0.5},
                 library=list(reversed(LIBRARY)))  # rows inserted in another order: the same table
    got = E.compare_runs(a, b)
    assert got == {rel: "equal" for rel in (
        "checkpoints/iter_000001/manifest.json", "checkpoints/iter_000001/trainable.safetensors", "config.yaml",
        "episodes.jsonl", "eval/after.json", "eval/summary.json", "library.sqlite", "metrics.jsonl")}
    assert not E.trained(a)  # every lora_B is zero: nothing trained


def test_a_changed_metric_names_its_row_iteration_and_key(tmp_path):
    rows = [ROWS[0], {**ROWS[1], "loss": 1.2500000000000002}]
    got = E.compare_runs(make_run(tmp_path / "a"), make_run(tmp_path / "b", rows=rows))
    assert got["metrics.jsonl"] == "differs: row 1 (iteration 1): loss: 1.25 != 1.2500000000000002"
    assert [k for k, v in got.items() if v != "equal"] == ["metrics.jsonl"]


def test_an_int_turned_float_a_new_key_and_a_missing_row_differ():
    assert E.first_difference({"n": 2}, {"n": 2.0}) == "n: 2 != 2.0"
    assert E.first_difference({"x": [1, {"y": 1}]}, {"x": [1, {"y": 1, "z": 0}]}) == \
        "x[1]: keys only in before [], only in after ['z']"
    assert E.first_difference([1, 2], [1]) == ".: 2 items before, 1 after"
    assert E.first_difference(float("nan"), float("nan")) is None


def test_one_changed_weight_element_differs_with_its_count_and_size(tmp_path):
    w = {k: v.clone() for k, v in WEIGHTS.items()}
    w["a.lora_B.weight"][1, 0] = 0.5
    b = make_run(tmp_path / "b", weights=w)
    got = E.compare_runs(make_run(tmp_path / "a"), b)
    assert got["checkpoints/iter_000001/trainable.safetensors"] == \
        "differs: a.lora_B.weight: 1 of 6 elements differ, max |diff| 0.5"
    assert E.trained(b)
    w16 = {k: v.to(torch.bfloat16) for k, v in WEIGHTS.items()}
    got = E.compare_runs(make_run(tmp_path / "a16"), make_run(tmp_path / "b16", weights=w16))
    assert got["checkpoints/iter_000001/trainable.safetensors"] == \
        "differs: a.lora_A.weight: torch.float32 (2, 3) != torch.bfloat16 (2, 3)"


def test_evaluation_library_and_file_set_changes_differ(tmp_path):
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b", ev={**EVAL, "per_game_wins": [1, 1]}, library=[LIBRARY[0], (2, "take coin", 0.9)])
    (b / "eval" / "before.json").write_text("{}")
    (b / "episodes.jsonl").unlink()
    got = E.compare_runs(a, b)
    assert got["eval/after.json"] == "differs: per_game_wins[1]: 0 != 1"
    assert got["library.sqlite"] == "differs: entries[1][2]: 1.0 != 0.9"
    assert got["eval/before.json"] == "only in after"
    assert got["episodes.jsonl"] == "only in before"
    assert not any(rel.startswith("events/") or rel == "curves.png" for rel in got)  # excluded, both differ


def test_a_changed_setting_in_config_yaml_differs(tmp_path):
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    (b / "config.yaml").write_text(f"run:\n  dir: {b}\n  seed: 1\nmodel:\n  name_or_path: tiny\n")
    assert E.compare_runs(a, b)["config.yaml"] == "differs: run.seed: 0 != 1"
