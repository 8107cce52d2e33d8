"""slea report: what the page is made of (slea/evaluation/html_report.py), from hand-made run folders."""

from __future__ import annotations

import json
import re

import pytest

from slea.evaluation.html_report import ReportError, clean, embed, gather, kind_of, render, write_report
from slea.experience.library import ExperienceLibrary
from slea.runs.episodes import EpisodeSampler
from slea.types import Step, Trajectory


def _traj(traj_id: int, won: bool, exp_ids=(), n=2) -> Trajectory:
    steps = [Step(group_id=0, traj_id=traj_id, step=k, anchor=f"room {k} </script><b>x</b>", prompt_ids=[1],
                  response_ids=[2], old_logprobs=[-1.0], reward=float(won and k == n - 1), action=f"go {k}",
                  cluster_id=k, experience_ids=list(exp_ids)) for k in range(n)]
    return Trajectory(group_id=0, traj_id=traj_id, goal="find it", task_type="t", seed=3, steps=steps, won=won)


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "config.yaml").write_text("run:\n  seed: 0\nalgorithm:\n  name: slea\nenv:\n  id: slea/Sokoban-v0\n")
    rows = [{"iteration": 0, "train/success": 0.25, "train/return": 0.1, "update/loss": float("nan"), "note": "x"},
            {"iteration": 1, "train/success": 0.5, "train/return": 0.3, "update/loss": 0.2}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))  # NaN as JSON's NaN
    table = {"family": "sokoban", "title": "Sokoban success %", "columns": ["All"],
             "rows": [{"label": "sampled T=1", "episodes": 4, "values": {"All": 50.0}, "n": {"All": 4}}]}
    for name, succ in (("before", 0.25), ("after", 0.5)):
        (run / "eval" / f"{name}.json").write_text(json.dumps(
            {"env": "slea/Sokoban-v0", "sampled": {"success": succ, "invalid_rate": 0.1, "episodes": 4.0},
             "per_game_wins": [2], "table": table}))
    (run / "eval" / "summary.json").write_text(json.dumps({"iterations": 2, "episodes": 8, "wall_s": 3.0}))
    lib = ExperienceLibrary(run / "library.sqlite")
    a = lib.add("Go north first.", "pos", "principle", 1.0, sources=[1], clusters=[0], iteration=0).entry_id
    b = lib.add("Do not wait.", "neg", "example", 0.2, sources=[0], clusters=[1], iteration=0).entry_id
    lib.add("Never used, never recorded.", "neg", "pattern", 0.1, sources=[9], clusters=[4], iteration=0)

    class Manager:
        library = lib

    s = EpisodeSampler(run, per_iteration=2, max_bytes=10**6)
    s.record(0, [_traj(0, False), _traj(1, True)], None, Manager())
    s.record(1, [_traj(0, True, exp_ids=[a, b])], None, Manager())
    lib.close()
    return run, a, b


def test_gather_reads_every_part_of_a_run_folder(run_dir):
    run, a, b = run_dir
    d = gather(run)
    assert d["kind"] == "run" and d["facts"]["algorithm"] == "slea" and d["facts"]["iterations"] == 2
    c = d["curves"]
    assert c["x"] == [1, 2] and c["main"] == ["train/success", "train/return"]  # counted from 1, as the log
    assert c["series"]["update/loss"] == [None, 0.2] and "note" not in c["series"]  # NaN -> null; text not a curve
    summary, *paper = d["evals"]
    assert [r[0] for r in summary["rows"]] == ["before", "after"]  # summary.json is not an evaluation
    assert summary["rows"][1][2] == "0.500" and paper[0]["rows"][0] == ["sampled T=1", "50.0", "4"]
    eps = d["episodes"]
    assert [(e["iteration"], e["traj"], e["won"]) for e in eps] == [(0, 1, True), (0, 0, False), (1, 0, True)]
    entries = {e["id"]: e for e in d["library"]["entries"]}
    assert entries[a]["from"] == [0] and entries[b]["from"] == [1]  # the episodes they were distilled from
    assert entries[a]["used"] == [2] == entries[b]["used"]  # ... and the one that retrieved them
    assert d["library"]["total"] == 3 and [e for e in entries.values() if not e["from"] and not e["used"]]
    json.dumps(d, allow_nan=False)  # strict JSON: the page's JSON.parse rejects NaN


def test_the_training_signals_a_verl_or_trl_user_watches_are_charted_when_logged(tmp_path):
    """``curves.watch``: the response lengths, clip fraction, approx-KL, learning rate and seconds per phase, each
    chart with the keys the run logged (several per chart where they belong together); none for a run without."""
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"iteration": i, "train/success": 0.5, "response/length_mean": 4.0 + i, "response/length_max": 6.0,
             "response/clipped_frac": 0.25, "update/clip_frac": 0.1, "update/approx_kl": 1e-3, "update/lr": 3e-4,
             "time/rollout_s": 2.0, "time/train_s": 1.0} for i in range(2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    watch = {w["title"]: w["keys"] for w in gather(run)["curves"]["watch"]}
    assert watch["response length (tokens)"] == ["response/length_mean", "response/length_max"]
    assert watch["seconds per phase"] == ["time/rollout_s", "time/train_s"]
    for key in ("response/clipped_frac", "update/clip_frac", "update/approx_kl", "update/lr"):
        assert [key] in watch.values(), key
    assert "KL to the reference" not in watch  # kl_coef 0: update/kl was never logged
    (run / "metrics.jsonl").write_text(json.dumps({"iteration": 0, "train/success": 0.5}) + "\n")
    assert gather(run)["curves"]["watch"] == []


def test_the_page_embeds_the_data_without_closing_its_script(run_dir):
    run, _, _ = run_dir
    html = render(gather(run))
    assert "__SLEA_REPORT_DATA__" not in html and "<title>slea report: run</title>" in html
    body = re.search(r'<script type="application/json" id="slea-data">(.*?)</script>', html, re.DOTALL).group(1)
    data = json.loads(body)
    assert data["episodes"][0]["steps"][0]["obs"].startswith("room 0 </script><b>")  # the text, intact
    assert "<" not in body  # ... but no raw '<' that could end the element
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", html)  # nothing fetched from a network


def test_clean_and_embed():
    assert clean({"a": float("inf"), "b": (1, float("nan")), 2: [None, True]}) == \
        {"a": None, "b": [1, None], "2": [None, True]}
    assert embed({"t": "</script>\u2028"}) == '{"t": "\\u003c/script>\\u2028"}'


def test_kind_of_refuses_what_is_not_a_run(tmp_path):
    with pytest.raises(ReportError, match="is not a folder"):
        kind_of(tmp_path / "missing")
    with pytest.raises(ReportError, match="neither a run folder"):
        kind_of(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("")
    assert kind_of(tmp_path) == "run"


def test_a_run_without_library_episodes_or_evals_still_reports(tmp_path):
    (tmp_path / "config.yaml").write_text("algorithm: {name: grpo}\n")
    d = gather(tmp_path)
    assert d["library"] is None and d["episodes"] == [] and d["evals"] == [] and d["curves"]["x"] == []
    path = write_report(tmp_path)
    assert path == tmp_path / "report.html" and path.read_text().startswith("<!DOCTYPE html>")


def test_a_compare_folder_reports_its_table_and_every_sub_run(tmp_path):
    out = tmp_path / "cmp"
    for name in ("grpo-s0", "slea-s0"):
        (out / "runs" / name).mkdir(parents=True)
        (out / "runs" / name / "metrics.jsonl").write_text("".join(
            json.dumps({"iteration": i, "env_steps": 10 * (i + 1), "train/success": 0.1 * i}) + "\n"
            for i in range(3)))
    (out / "compare.json").write_text(json.dumps({"config": "c.yaml", "algorithms": ["grpo", "slea"],
                                                  "seeds": [0], "overrides": []}))
    stat = lambda m, n=1: {"mean": m, "std": 0.0, "n": n, "values": [m]}
    none = {"mean": None, "std": None, "n": 0, "values": []}
    (out / "table.json").write_text(json.dumps({"budgets": [30], "algorithms": {
        algo: {"seeds": [0], "heldout_success": stat(v), "heldout_greedy_success": none,
               "heldout_success_before": none, "train_success_at_env_steps": {"30": stat(0.2)},
               "env_steps": stat(30.0), "wall_s": stat(120.0)} for algo, v in (("grpo", 0.5), ("slea", 0.75))}}))
    d = gather(out)
    assert d["kind"] == "compare" and d["facts"]["algorithms"] == "grpo, slea"
    t = d["comparison"]
    assert "train succ. @ 30 steps" in t["columns"]
    assert t["rows"][1][:3] == ["slea", "0", "0.750"] and t["rows"][1][-1] == "2.0"
    assert [(r["algorithm"], r["seed"], r["x"]) for r in d["runs"]] == [("grpo", "0", [10.0, 20.0, 30.0]),
                                                                       ("slea", "0", [10.0, 20.0, 30.0])]
    assert d["pairs"] is None  # a table.json without pairs (an older slea's): no paired table


def test_a_compare_page_shows_the_paired_p_ci_and_verdict_of_table_md(tmp_path):
    """Before, the page showed the per-arm table only: the paired differences, p, CI and verdict that table.md
    gives were missing."""
    from slea.compare import SubRun, summarize_runs, table_markdown
    from slea.evaluation.html_report import render

    out = tmp_path / "cmp"
    runs = []
    for arm, wins in (("grpo", [0, 1, 1, 2]), ("slea", [2, 1, 1, 2])):
        for seed in range(3):
            d = out / "runs" / f"{arm}-s{seed}"
            (d / "eval").mkdir(parents=True)
            (d / "metrics.jsonl").write_text(json.dumps({"iteration": 0, "env_steps": 10, "train/success": 0.5}) + "\n")
            after = {"games": 4, "sampled": {"success": sum(wins) / 8, "episodes": 8.0}, "per_game_wins": wins}
            (d / "eval/summary.json").write_text(json.dumps({"after": after, "wall_s": 60}))
            runs.append(SubRun(arm, seed, d))
    table = summarize_runs(runs)
    (out / "table.json").write_text(json.dumps(table))
    d = gather(out)
    pairs = d["pairs"]
    assert pairs["title"] == "Against grpo, held-out success paired by seed"
    assert pairs["columns"] == ["comparison", "n", "per-seed differences", "mean ± std", "p (exact sign-flip)",
                                "smallest possible p", "95% CI (bootstrap)", "verdict"]
    row = pairs["rows"][0]
    assert row[:6] == ["slea − grpo", "3", "s0 +0.250, s1 +0.250, s2 +0.250", "+0.250 ± 0.000", "0.250", "0.250"]
    assert row[-1] == "not separated" and row[6].endswith("(seeds, games)")
    assert "| " + " | ".join(row) + " |" in table_markdown(table)  # the same cells as table.md's row
    assert "sign-flip" in pairs["note"]
    page = render(d)
    assert '"Against grpo, held-out success paired by seed"' in page and 'section("pairs"' in page


def test_cli_report_writes_the_page_and_refuses_a_bad_path_in_one_line(run_dir, tmp_path):
    from typer.testing import CliRunner

    from slea.cli import app

    run, _, _ = run_dir
    res = CliRunner().invoke(app, ["report", str(run), "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "r.html").stat().st_size > 10_000
    bad = CliRunner().invoke(app, ["report", str(tmp_path / "nope")])
    assert bad.exit_code == 2
    assert bad.output.strip().splitlines() == [f"report: {tmp_path / 'nope'} is not a folder"]
