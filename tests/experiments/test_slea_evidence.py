"""experiments/slea_evidence.py and experiments/control_recall.py read a run's extra evaluations (retrieval off, the
wider held-out set) where ``slea eval --out RUN/eval_<kind>`` wrote them, or from the copy older run folders have
(fake run folders; nothing is trained)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slea.testing.bench import load_script

E = load_script(Path(__file__).resolve().parents[2] / "experiments" / "slea_evidence.py")
C = load_script(Path(__file__).resolve().parents[2] / "experiments" / "control_recall.py")


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
    from slea.compare import SubRun

    runs = []
    for algo, seed, wide in (("grpo", 0, 0.5), ("slea", 0, 0.75), ("grpo", 1, 0.25), ("slea", 1, 0.0)):
        d = _run(tmp_path, f"{algo}-s{seed}", 0.5)
        (d / "eval_wide" / "eval").mkdir(parents=True)
        (d / "eval_wide" / "eval" / "eval-heldout.json").write_text(_result(wide))
        runs.append(SubRun(algo, seed, d, "reused"))
    p = E.paired(runs, "slea", kind="wide")
    assert p["seeds"] == [0, 1] and p["diffs"] == [0.25, -0.25] and p["mean"] == 0.0
    assert E.paired(runs, "slea")["diffs"] == [0.0, 0.0]
    # with p (two seeds: never below 0.5) and a CI over seeds (these results keep no per-game wins)
    assert p["p"] == 1.0 and p["p_min"] == 0.5 and p["ci_method"] == "seeds" and p["verdict"] == "not separated"
    pairs = {(c["a"], c["b"]) for c in E.comparisons(runs)}
    assert pairs == {("slea", "grpo"), ("slea (wide)", "grpo (wide)")}


def test_comparisons_pair_games_and_the_library_off_evaluation(tmp_path):
    from slea.compare import SubRun

    def result(wins):
        return {"games": 2, "per_game_wins": wins, "sampled": {"success": sum(wins) / 8, "episodes": 8.0}}

    runs = []
    for variant, seed, wins, off in (("grpo", 0, [1, 1], None), ("slea", 0, [4, 1], [1, 1]),
                                     ("grpo", 1, [0, 1], None), ("slea", 1, [3, 1], [0, 1])):
        d = tmp_path / variant / "runs" / f"{variant}-s{seed}"
        (d / "eval").mkdir(parents=True)
        (d / "eval" / "summary.json").write_text(json.dumps({"after": result(wins)}))
        if off:
            (d / "eval_library_off" / "eval").mkdir(parents=True)
            (d / "eval_library_off" / "eval" / "eval-heldout.json").write_text(json.dumps(result(off)))
        runs.append(SubRun(variant, seed, d, "reused"))
    got = {(c["a"], c["b"]): c for c in E.comparisons(runs)}
    assert set(got) == {("slea", "grpo"), ("slea", "slea (library_off)")}
    c = got[("slea", "grpo")]
    assert c["diffs"] == [0.375, 0.375] and c["p"] == 0.5 and c["ci_method"] == "seeds, then games"
    assert got[("slea", "slea (library_off)")]["diffs"] == [0.375, 0.375]
    assert "| slea − grpo | 2 | s0 +0.375, s1 +0.375 | +0.375 ± 0.000 | 0.500 | 0.500 |" in E.stats.markdown_table(
        list(got.values()))


def test_comparisons_pit_slea_against_gigpo_as_the_criterion_needs(tmp_path):
    from slea.compare import SubRun

    runs = []
    for variant, seed, success in (("grpo", 0, 0.5), ("gigpo", 0, 0.25), ("slea", 0, 0.75),
                                   ("grpo", 1, 0.5), ("gigpo", 1, 0.75), ("slea", 1, 0.5)):
        runs.append(SubRun(variant, seed, _run(tmp_path / variant, f"{variant}-s{seed}", success), "reused"))
    got = {(c["a"], c["b"]): c for c in E.comparisons(runs)}
    assert set(got) == {("gigpo", "grpo"), ("slea", "grpo"), ("slea", "gigpo")}
    assert got[("slea", "gigpo")]["diffs"] == [0.5, -0.25] and got[("slea", "grpo")]["diffs"] == [0.25, 0.0]


def test_collapse_signals_average_the_late_iterations_and_pair_by_seed(tmp_path):
    from slea.compare import SubRun

    def run_with(variant, seed, entropies):
        d = _run(tmp_path / variant, f"{variant}-s{seed}", 0.5)
        rows = [{"iteration": i, "rollout/entropy": e, "collapse/equal_return_frac": 0.5} for i, e in enumerate(entropies)]
        (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        return SubRun(variant, seed, d, "reused")

    # iterations 0-5 are left out: only 1.0 and 3.0 (s0) and 2.0 and 2.0 (s1) count for slea
    early = [9.0] * E.COLLAPSE_FROM
    runs = [run_with("slea", 0, early + [1.0, 3.0]), run_with("slea", 1, early + [2.0, 2.0]),
            run_with("grpo", 0, early + [0.5, 0.5]), run_with("grpo", 1, early + [1.0, 2.0])]
    sig = E.collapse_signals(runs[0].dir)
    assert sig["rollout/entropy"] == 2.0 and sig["collapse/equal_return_frac"] == 0.5
    assert sig["collapse/distinct_first_actions"] is None and sig["rollout/entropy@0"] == 9.0
    signals = {v: {r.seed: E.collapse_signals(r.dir) for r in runs if r.algorithm == v} for v in ("slea", "grpo")}
    got = {c["metric"]: c for c in E.collapse_comparisons(signals, [("slea", "grpo")])}
    assert set(got) == {"rollout/entropy", "collapse/equal_return_frac"}  # no run logs the third signal
    assert got["rollout/entropy"]["diffs"] == [1.5, 0.5] and got["rollout/entropy"]["p"] == 0.5
    assert got["collapse/equal_return_frac"]["diffs"] == [0.0, 0.0]
    summary = E.collapse_summary(signals["grpo"])  # grpo's late means: 0.5 (s0) and 1.5 (s1)
    assert summary["rollout/entropy"] == pytest.approx({"n": 2, "mean": 1.0, "std": 2 ** -0.5, "min": 0.5, "max": 1.5})
    assert "collapse/distinct_first_actions" not in summary


def test_arm_pairs_are_each_variant_against_grpo_then_slea_against_gigpo_and_its_ablations():
    assert E.arm_pairs(["slea", "grpo", "gigpo", "slea_task"]) == [
        ("slea", "grpo"), ("gigpo", "grpo"), ("slea_task", "grpo"), ("slea", "gigpo"), ("slea", "slea_task")]


def test_a_run_writes_its_run_folder_and_no_one_seed_table(tmp_path, monkeypatch):
    # training itself is replaced (it takes minutes); what is checked is what ``run`` leaves in the variant folder
    trained = []

    def fake_train(sub, cfg, say=None, label=None):
        (sub.dir / "eval").mkdir(parents=True)
        (sub.dir / "eval" / "summary.json").write_text(json.dumps({"after": {"sampled": {"success": 0.5}}}))
        trained.append((sub.algorithm, sub.seed, cfg.algorithm.name))
        return "trained"

    monkeypatch.setattr(E, "RESULTS", tmp_path)
    monkeypatch.setattr(E.compare, "train_sub_run", fake_train)
    E.train("default8", "grpo", 3)
    assert trained == [("grpo", 3, "grpo")]
    assert (tmp_path / "default8" / "grpo" / "runs" / "grpo-s3" / "eval" / "summary.json").is_file()
    assert sorted(p.name for p in (tmp_path / "default8" / "grpo").iterdir()) == ["runs"]


def test_cap_keeps_the_first_whole_records_and_says_how_to_get_the_rest(tmp_path):
    import hashlib

    from slea.runs.episodes import read_episodes

    d = tmp_path / "runs" / "slea-s0"
    d.mkdir(parents=True)
    rows = [json.dumps({"iteration": i // 2, "traj": i, "steps": [{"obs": "x" * 40}]}) + "\n" for i in range(10)]
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


def test_a_finished_run_names_repository_paths_not_the_machines(tmp_path):
    run = tmp_path / "default8" / "slea" / "runs" / "slea-s0"
    (run / "eval_library_off" / "eval").mkdir(parents=True)
    (run / "config.yaml").write_text(f"run:\n  dir: {tmp_path}/experiments/results/evidence/default8/slea/runs/"
                                     "slea-s0\nconfig: /home/u/slea/configs/slea.yaml\n")
    (run / "eval_library_off" / "eval" / "eval-heldout.json").write_text(
        json.dumps({"run_dir": "/x/y/experiments/results/evidence/default8/slea/runs/slea-s0"}))
    (run / "notes.txt").write_text("/x/y/experiments/results/evidence/ stays: not a saved config or result")
    assert E.portable(run) == 2
    assert (run / "config.yaml").read_text() == ("run:\n  dir: experiments/results/evidence/default8/slea/runs/"
                                                 "slea-s0\nconfig: configs/slea.yaml\n")
    assert "/x/y" not in (run / "eval_library_off" / "eval" / "eval-heldout.json").read_text()
    assert "/x/y" in (run / "notes.txt").read_text()
    assert E.portable(run) == 0


# -- the committed jobs: their tables and the page ----------------------------------------------------------------
def test_the_committed_tables_are_what_the_table_command_makes_of_the_committed_runs(tmp_path, monkeypatch):
    import shutil

    committed = E.RESULTS
    monkeypatch.setattr(E, "RESULTS", tmp_path)
    made = {}
    for job in ("default", "hard", "default8"):
        shutil.copytree(committed / job, tmp_path / job)
        E.table(job)
        assert (tmp_path / job / "table.md").read_text() == (committed / job / "table.md").read_text(), job
        made[job] = json.loads((tmp_path / job / "table.json").read_text())
        saved = json.loads((committed / job / "table.json").read_text())
        for tab in (made[job], saved):  # the spec names every variant the script knows, run or not
            tab["spec"].pop("variants")
        assert made[job] == saved, job
    page = " ".join((E.ROOT / "docs" / "results" / "slea_evidence.md").read_text().split())

    def pair(job, a, b):
        return next(p for p in made[job]["pairs"] if (p["a"], p["b"]) == (a, b))

    def quoted(p):  # as the page writes it: mean ± std (n = 8, p = …, CI […]) with true minus signs
        ci = ", ".join(f"{x:+.3f}" for x in p["ci"]).replace("-", "−")
        return f"{p['mean']:+.3f} ± {p['std']:.3f}".replace("-", "−"), f"CI [{ci}]"

    for a, b, p_text in (("slea", "grpo", "p = 1.0"), ("slea", "gigpo", "p = 0.31"), ("gigpo", "grpo", "p = 0.25")):
        p = pair("default8", a, b)
        ms, ci = quoted(p)
        assert f"{ms} (n = 8, {p_text}, {ci}" in page and p["verdict"] == "not separated", (a, b)
    # retrieval off changes no default8 slea policy, and its held-out steps retrieve at 0.00-0.05
    assert pair("default8", "slea", "slea (library_off)")["diffs"] == [0.0] * 8
    hits = [v["heldout_hit_rate"] for v in made["default8"]["algorithms"]["slea"]["library"].values()]
    assert (f"{min(hits):.2f}", f"{max(hits):.2f}") == ("0.00", "0.05") and "a rate of 0.00-0.05" in page
    # the hard job's slea_tt: retrieval off lifts both seeds, not separated (n = 2)
    tt = pair("hard", "slea_tt", "slea_tt (library_off)")
    assert f"slea_tt − its retrieval-off self {quoted(tt)[0]}, n = 2, p = 0.50" in page
    assert "Our reading, from 2 seeds and not tested" in page and "present in every run on this page" not in page
