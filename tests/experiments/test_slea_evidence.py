"""experiments/slea_evidence.py and experiments/control_recall.py read a run's extra evaluations (retrieval off, the
wider held-out set) where ``slea eval --out RUN/eval_<kind>`` wrote them, or from the copy older run folders have
(fake run folders; nothing is trained)."""

from __future__ import annotations

import json
from pathlib import Path

from slea.testing.bench import load_experiment

E = load_experiment("slea_evidence")
C = load_experiment("control_recall")


def _result(success: float) -> str:
    return json.dumps({"sampled": {"success": success}})


def _run(tmp_path: Path, name: str, summary: float) -> Path:
    d = tmp_path / "runs" / name
    (d / "eval").mkdir(parents=True)
    (d / "eval" / "summary.json").write_text(json.dumps({"after": {"sampled": {"success": summary}}}))
    return d


def test_extra_evaluations_are_read_where_slea_eval_wrote_them(tmp_path):
    d = _run(tmp_path, "slea-s0", 0.5)
    assert E.extra_eval(d, "library_off") is None and E._heldout(d, "library_off") is None
    (d / "eval_library_off" / "eval").mkdir(parents=True)
    (d / "eval_library_off" / "eval" / "eval-heldout.json").write_text(_result(0.25))
    (d / "eval_library_off" / "eval" / "eval-heldout.md").write_text("| table |")
    assert E.extra_eval(d, "library_off") == d / "eval_library_off" / "eval" / "eval-heldout.json"
    assert E._heldout(d) == 0.5 and E._heldout(d, "library_off") == 0.25
    assert C.library_off_eval(d) == d / "eval_library_off" / "eval" / "eval-heldout.json"
    # an older run folder: only the copy in eval/
    old = _run(tmp_path, "slea-s1", 0.75)
    (old / "eval" / "wide.json").write_text(_result(0.125))
    assert E._heldout(old, "wide") == 0.125 and E._heldout(old, "library_off") is None
    assert C.library_off_eval(old) == old / "eval" / "library_off.json"


def test_paired_differences_use_the_extra_evaluation(tmp_path):
    from slea.trainer.compare import SubRun

    runs = []
    for algo, seed, wide in (("grpo", 0, 0.5), ("slea", 0, 0.75), ("grpo", 1, 0.25), ("slea", 1, 0.0)):
        d = _run(tmp_path, f"{algo}-s{seed}", 0.5)
        (d / "eval_wide" / "eval").mkdir(parents=True)
        (d / "eval_wide" / "eval" / "eval-heldout.json").write_text(_result(wide))
        runs.append(SubRun(algo, seed, d, "reused"))
    p = E.paired(runs, "slea", kind="wide")
    assert p["seeds"] == [0, 1] and p["diffs"] == [0.25, -0.25] and p["mean"] == 0.0
    assert E.paired(runs, "slea")["diffs"] == [0.0, 0.0]


def test_cap_keeps_the_first_whole_records_and_says_how_to_get_the_rest(tmp_path):
    import hashlib

    from slea.trainer.episodes import read_episodes

    d = tmp_path / "runs" / "slea-s0"
    d.mkdir(parents=True)
    rows = [json.dumps({"iteration": i // 2, "traj": i, "steps": ["x" * 40]}) + "\n" for i in range(10)]
    whole = "".join(rows).encode()
    (d / "episodes.jsonl").write_bytes(whole)
    budget = len(rows[0]) * 3 + 5  # three whole records fit, a fourth does not
    note = E.cap_jsonl(d / "episodes.jsonl", budget, "python experiments/slea_evidence.py run ...")
    assert (d / "episodes.jsonl").read_text() == "".join(rows[:3])
    assert [r["traj"] for r in read_episodes(d / "episodes.jsonl")] == [0, 1, 2]  # slea report still reads it
    assert note == json.loads((d / "episodes.cap.json").read_text())
    assert (note["records"], note["kept_records"], note["bytes"]) == (10, 3, len(whole))
    assert note["sha1"] == hashlib.sha1(whole).hexdigest() and note["recreate"].startswith("python experiments/")
    assert E.cap_jsonl(d / "episodes.jsonl", budget, "again") is None  # within the budget now: left alone
    assert E.cap_episodes(tmp_path, "x") is None  # no episodes.jsonl
    assert "--job hard --variant slea_tt --seed 1" in E.recreate_command("hard", "slea_tt", 1)
