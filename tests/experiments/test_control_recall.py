"""experiments/control_recall.py's diagnosis of ``slea agent --trace`` rows, on hand-made rows (no model)."""

from __future__ import annotations

from pathlib import Path

from slea.envs.recall import generate_game
from slea.testing.bench import load_script

S = load_script(Path(__file__).resolve().parents[2] / "experiments" / "control_recall.py")

# held-out game 0: garden (right: whistle; listed kneel, whistle, bow, clap), forge (whistle; listed kneel first),
# library (bow; listed whistle first)
GARDEN, FORGE, LIBRARY = (r.text for r in generate_game("heldout", 0, 3))
WHISTLE = {"id": 2, "zone": "pos", "text": "'whistle' earned the reward on this kind of task."}
PLAN = {"id": 13, "zone": "pos", "text": "A plan that earned reward: 'whistle' → 'bow' (2 steps, no step wasted)."}
KNEEL = {"id": 9, "zone": "pos", "text": "A plan that earned reward: 'kneel' → 'whistle' (2 steps)."}
WARN = {"id": 5, "zone": "neg", "text": "Invalid answers wasted 5 of 5 steps: answer with one command."}
GONE = {"id": 99, "zone": None, "text": None}


def _row(anchor, action, exps, *, cond="with", mode="greedy", valid=True, step=0):
    return {"condition": cond, "mode": mode, "round": 0, "seed": 0, "traj_id": 0, "step": step, "anchor": anchor,
            "action": action, "response": action, "valid": valid, "reward": 0.0, "done": False, "won": False,
            "cluster_id": 1, "experiences": exps}


def _get(d, cond, mode, chamber):
    return next(x for x in d["table"] if (x["condition"], x["mode"], x["chamber"]) == (cond, mode, chamber))


def test_helpers_map_anchors_and_quoted_gestures():
    assert (S.chamber_of(GARDEN), S.chamber_of(FORGE), S.chamber_of("You see nothing.")) == ("garden", "forge",
                                                                                             "other")
    assert S.named_gestures(KNEEL["text"]) == ["kneel", "whistle"]
    assert S.named_gestures("the work is done by 'whistle …', 'clap …' commands") == ["whistle", "clap"]
    assert S.named_gestures("'take apple' and 'whistle' and 'whistle'") == ["whistle"]
    assert S.named_gestures(None) == []
    assert S.listed_first(_row(FORGE, "kneel", [])) == "kneel"
    assert S.listed_first(_row("elsewhere", "kneel", [])) is None


def test_diagnosis_counts_by_hand():
    rows = [
        # garden: right = whistle. Named only-right, copied top, right.
        _row(GARDEN, "whistle", [WHISTLE, WARN]),
        # garden: named (by the plan too) but not only (the plan names bow); answered bow: copies the top
        # lesson (whistle → bow names bow) and any; wrong
        _row(GARDEN, "bow", [PLAN, WHISTLE]),
        # forge: right = whistle; the top lesson is kneel → whistle (names whistle, so named, not only);
        # answered kneel: copies top, wrong, the first listed gesture (kneel)
        _row(FORGE, "kneel", [KNEEL, GONE]),
        # library: right = bow; a warning only: nothing named; an invalid answer
        _row(LIBRARY, "", [WARN], valid=False),
        # without the library: forge answered whistle (right, not named, first listed is kneel)
        _row(FORGE, "whistle", [], cond="without"),
    ]
    d = S.diagnosis(rows)
    g = _get(d, "with", "greedy", "garden")
    assert {k: g[k] for k in S.COUNTS} == {"steps": 2, "retrieved": 2, "named_right": 2, "only_right": 1,
                                           "copies_top": 2, "copies_any": 2, "right": 1, "first_listed": 0,
                                           "named_right_and_right": 1, "not_named_right_and_right": 0}
    assert g["actions"] == {"whistle": 1, "bow": 1}
    f = _get(d, "with", "greedy", "forge")
    assert (f["named_right"], f["only_right"], f["copies_top"], f["right"], f["first_listed"]) == (1, 0, 1, 0, 1)
    lib = _get(d, "with", "greedy", "library")
    assert (lib["retrieved"], lib["named_right"], lib["copies_any"], lib["actions"]) == (1, 0, 0, {"invalid": 1})
    a = _get(d, "with", "greedy", "all")
    assert (a["steps"], a["named_right"], a["only_right"], a["right"], a["named_right_and_right"]) == (4, 3, 1, 1, 1)
    w = _get(d, "without", "greedy", "forge")
    assert (w["retrieved"], w["named_right"], w["right"], w["not_named_right_and_right"], w["first_listed"]) == \
        (0, 0, 1, 1, 0)
    # the without rows come first; the distinct retrieved sets per chamber (with the library only)
    assert d["table"][0]["condition"] == "without"
    assert [s["steps"] for s in d["retrieved_sets"]["garden"]] == [1, 1]
    assert "forge" in d["retrieved_sets"] and "without" not in str(d["retrieved_sets"])
    md = S.diagnosis_markdown(d)
    assert "| with | greedy | garden (whistle) | 2 | 2 | 2 | 1 | 2 | 2 | 1/2 (50%) | 1/2 (50%) | 0/0 |" in md


def test_the_diagnose_call_is_the_heldout_call_plus_trace(tmp_path):
    args = S.heldout_args(tmp_path / "lib.sqlite", tmp_path / "out")
    assert args[:1] == ["agent"] and "--evolve" not in args and "--split" not in args
    assert args[args.index("--games") + 1] == str(S.HELDOUT["games"])
    assert args[args.index("--library") + 1].endswith("lib.sqlite")
    assert "experience.mode=step" in args


def _finished_run(folder, arm, seed, wins, episodes=2):
    import json

    d = folder / "runs" / f"{arm}-s{seed}"
    (d / "eval").mkdir(parents=True)
    (d / "metrics.jsonl").write_text(json.dumps({"iteration": 0, "train/success": 0.0, "env_steps": 10}) + "\n")
    after = {"games": len(wins), "per_game_wins": wins,
             "sampled": {"success": sum(wins) / (episodes * len(wins)), "episodes": float(episodes * len(wins))}}
    (d / "eval" / "summary.json").write_text(json.dumps({"after": after, "wall_s": 1.0}))
    return d


def test_compare_table_reads_the_arms_from_the_run_folders(tmp_path):
    import json

    folder = tmp_path / "study"
    for seed in range(3):  # slea wins game 0 on every seed; grpo never; slea_task once
        _finished_run(folder, "slea", seed, [2, 0, 0, 0])
        _finished_run(folder, "grpo", seed, [0, 0, 0, 0])
        _finished_run(folder, "slea_task", seed, [2 if seed == 0 else 0, 0, 0, 0])
    (folder / "runs" / "notes").mkdir()  # a folder name that is no run: skipped
    md = S.compare_table(folder)
    tab = json.loads((folder / "table.json").read_text())
    pairs = {(p["a"], p["b"]): p for p in tab["pairs"]}
    assert set(pairs) == {("slea", "grpo"), ("slea_task", "grpo"), ("slea", "slea_task")}
    p = pairs[("slea", "grpo")]
    assert p["diffs"] == [0.25] * 3 and p["p"] == 0.25 and p["p_min"] == 0.25 and p["verdict"] == "not separated"
    assert p["ci_method"] == "seeds, then games"
    assert pairs[("slea", "slea_task")]["diffs"] == [0.0, 0.25, 0.25]
    assert "| slea − grpo | 3 | s0 +0.250, s1 +0.250, s2 +0.250 | +0.250 ± 0.000 | 0.250 | 0.250 |" in md
    assert "| slea_task | 3 |" in md and (folder / "curves.png").is_file()


def test_secondary_analyses_by_hand(tmp_path):
    import json
    import sqlite3

    d = tmp_path / "slea-s0"
    d.mkdir()
    rows = [{"iteration": 0, "train/success": 0.0}, {"iteration": 1, "train/success": 0.0},
            {"iteration": 2, "train/success": 0.03}]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert S.first_success(d) == 2
    lib = d / "library.sqlite"
    with sqlite3.connect(lib) as conn:
        conn.executescript("CREATE TABLE obs_clusters (cid INTEGER, prototype TEXT);"
                           "CREATE TABLE entry_clusters (entry_id INTEGER, cluster_id INTEGER);"
                           "CREATE TABLE entries (id INTEGER, zone TEXT, text TEXT, created_iter INTEGER);")
        conn.executemany("INSERT INTO obs_clusters VALUES (?, ?)", [(1, GARDEN), (2, LIBRARY)])
        conn.executemany("INSERT INTO entries VALUES (?, ?, ?, ?)", [
            (1, "pos", WHISTLE["text"], 1),  # garden's right gesture, linked to the garden: counts
            (2, "pos", "'whistle' earned the reward on this kind of task.", 1),  # linked to the library: wrong
            (3, "pos", "'bow' earned the reward on this kind of task.", 3),  # right for the library, but too late
            (4, "neg", "'bow' ended the episode in failure.", 0)])  # a warning is no winning lesson
        conn.executemany("INSERT INTO entry_clusters VALUES (?, ?)", [(1, 1), (2, 2), (3, 2), (4, 2)])
    assert S.winning_lessons(lib, 2) == 1 and S.winning_lessons(lib, 3) == 2
    steps = d / "steps.jsonl"
    trace = [dict(_row(GARDEN, "whistle", [WHISTLE]), won=True), dict(_row(FORGE, "bow", [WHISTLE]), won=True),
             dict(_row(LIBRARY, "bow", [WHISTLE]), won=False), dict(_row(GARDEN, "whistle", [], cond="without"),
                                                                    won=True)]
    steps.write_text("".join(json.dumps(r) + "\n" for r in trace))
    assert S.followed_on_wins(steps) == {"steps": 2, "followed": 0.5}  # won, with lessons: 1 of 2 copies the top


# -- the committed studies: their tables and the page -------------------------------------------------------------
STUDIES = ("compare", "eight_seeds", "eight_seeds_ent0.03", "sensitivity/lr1.5e-4/compare")


def test_the_committed_tables_are_what_the_table_command_makes_of_the_committed_runs(tmp_path):
    import json
    import shutil

    page = " ".join((S.ROOT / "docs" / "results" / "control_recall.md").read_text().split())
    made = {}
    for study in STUDIES:
        committed, copy = S.RESULTS / study, tmp_path / study
        shutil.copytree(committed / "runs", copy / "runs")
        if (committed / "compare.json").is_file():
            shutil.copy(committed / "compare.json", copy / "compare.json")
        assert S.compare_table(copy) == (committed / "table.md").read_text(), study
        made[study] = json.loads((copy / "table.json").read_text())
        assert made[study] == json.loads((committed / "table.json").read_text()), study

    def pair(study, a, b):
        return next(p for p in made[study]["pairs"] if (p["a"], p["b"]) == (a, b))

    def quoted(p, digits=3):  # as the page writes a comparison: mean ± std, then the CI with a true minus sign
        ci = ", ".join(f"{x:+.{digits}f}" for x in p["ci"]).replace("-", "−")
        return f"{p['mean']:+.{digits}f} ± {p['std']:.{digits}f}", f"CI [{ci}]"

    for study, a, b in (("eight_seeds", "slea", "grpo"), ("eight_seeds", "slea", "slea_task"),
                        ("eight_seeds_ent0.03", "slea", "grpo"), ("eight_seeds_ent0.03", "slea", "slea_task"),
                        ("compare", "slea", "grpo")):
        p = pair(study, a, b)
        ms, ci = quoted(p)
        assert ms in page and ci in page and p["verdict"] == "not separated", (study, a, b)
    assert pair("eight_seeds", "slea", "grpo")["p"] == 0.25 and pair("compare", "slea", "grpo")["p"] == 0.5
    # the lr 1.5e-4 study: slea − grpo +0.120 ± 0.207, p = 1.0, CI [+0.000, +0.344]
    p = pair("sensitivity/lr1.5e-4/compare", "slea", "grpo")
    assert "slea − grpo here: " + quoted(p)[0] + " (n = 3, p = 1.0, " + quoted(p)[1] + ")" in page
