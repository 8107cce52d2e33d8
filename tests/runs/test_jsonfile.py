"""Run-folder JSON read as untrusted input (slea/runs/jsonfile.py): capped in size and depth, of a schema's shape,
every failure one :class:`RunFileError` line naming the file; and the readers of a run's summary, evaluation and
comparison spec (``slea train --resume``, the trainer, ``slea compare``) refuse a damaged one in that one line."""

from __future__ import annotations

import json

import pytest

from slea.runs.jsonfile import MAX_DEPTH, RunFileError, Summary, depth, read_json


def test_depth_counts_nesting_levels_without_recursion():
    assert depth(1) == depth("x") == depth(None) == 0
    assert depth([]) == depth({}) == 1
    assert depth([[1], {"a": [2]}]) == 3  # the list, the object, the inner list
    assert depth({"a": {"b": {"c": []}}}) == 4
    deep: list = []
    for _ in range(100_000):  # deeper than Python's recursion limit: walked without recursion
        deep = [deep]
    assert depth(deep) == MAX_DEPTH + 1  # stops counting once past the cap


def test_read_json_caps_size_and_depth_and_checks_the_schema(tmp_path):
    p = tmp_path / "summary.json"
    p.write_text(json.dumps({"after": {"sampled": {"success": 0.5}}, "wall_s": 3, "extra": [1]}))
    assert read_json(p, Summary) == {"after": {"sampled": {"success": 0.5}}, "wall_s": 3, "extra": [1]}
    for text, says in [('{"after": {"sampled": {"success": "0.5"}}}', "summary.json: after.sampled.success"),
                       ('{"after": {"sampled": []}}', "summary.json: after.sampled"),
                       ('{"iterations": true}', "summary.json: iterations"),
                       ("[" * 70 + "]" * 70, "nests deeper than 64 levels"),
                       ("[" * 100_000 + "]" * 100_000, "nests deeper than 64 levels"),
                       ("{not json", "summary.json is not JSON")]:
        p.write_text(text)
        with pytest.raises(RunFileError, match=says.replace(".", r"\.").replace("[", r"\[")):
            read_json(p, Summary)
    p.write_text(json.dumps({"pad": "x" * 2000}))
    with pytest.raises(RunFileError, match="summary.json is 2011 bytes, more than the 1024 bytes"):
        read_json(p, max_bytes=1024)
    with pytest.raises(RunFileError, match="nothing.json is missing"):
        read_json(tmp_path / "nothing.json")


def test_a_damaged_summary_or_before_evaluation_is_one_line_not_a_traceback(tmp_path, capsys, caplog):
    """``slea train --resume`` on a run whose summary is damaged resumes it as unfinished (saying why in one line);
    the trainer leaves a damaged eval/before.json out; ``slea compare`` names the damaged sub-run's file."""
    from slea.cli.runs import finished
    from slea.compare import SubRun, summarize_runs
    from slea.config import build_config
    from slea.trainer.interrupt import StopSignal
    from slea.trainer.lifecycle import evaluation_before

    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "summary.json").write_text("[" * 100_000 + "]" * 100_000)
    assert finished(tmp_path, []) is False
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "summary.json nests deeper than 64 levels; resuming it as unfinished" in err[0]
    (tmp_path / "eval" / "before.json").write_text('{"sampled": "none"}')
    cfg = build_config({"eval": {"before": True}})
    assert evaluation_before(cfg, tmp_path, False, lambda: None, StopSignal()) is None
    assert "before.json: sampled" in caplog.text
    run = tmp_path / "runs" / "grpo-s0"
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "summary.json").write_text('{"after": {"sampled": {"success": [1]}}}')
    with pytest.raises(RunFileError, match="summary.json: after.sampled.success"):
        summarize_runs([SubRun("grpo", 0, run)])


def test_a_damaged_metrics_or_episodes_line_is_skipped_not_a_traceback(tmp_path, caplog):
    """metrics.jsonl and episodes.jsonl lines are read as the JSON files are: a 100k-deep line was a RecursionError
    in the report, compare and resume, a string iteration or env-step count a TypeError later; now each such line
    is skipped (metrics: with a warning naming the line and why) and the others kept."""
    from slea.runs.episodes import read_episodes
    from slea.runs.runlog import env_step_curve, read_metrics, truncate_metrics

    good = [{"iteration": i, "env_steps": 10.0 * (i + 1), "train/success": 0.5} for i in range(3)]
    lines = [json.dumps(good[0]), "[" * 100_000 + "]" * 100_000, json.dumps({"iteration": "1", "env_steps": 5}),
             json.dumps({"iteration": 1, "env_steps": "many"}), json.dumps(good[1]), '{"iteration": 2, "train/succ',
             json.dumps(good[2]), json.dumps({"iteration": 3, "pad": "x" * (2**20)})]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with caplog.at_level("WARNING"):
        rows = read_metrics(path)
    assert rows == good
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 5 and "metrics.jsonl:2: skipping malformed metrics line (nests deeper than 64" in warned[0]
    assert "(iteration: Input should be a valid integer)" in warned[1] and "(env_steps: " in warned[2]
    assert "(not JSON" in warned[3] and "(longer than 1048576 characters)" in warned[4]
    x, ys = env_step_curve(rows)
    assert x.tolist() == [10.0, 20.0, 30.0] and ys["train/success"].tolist() == [0.5] * 3
    truncate_metrics(path, 1)  # a resume keeps the good rows up to its checkpoint
    assert read_metrics(path) == good[:2]
    eps = tmp_path / "episodes.jsonl"
    eps.write_text("\n".join([json.dumps({"iteration": 0, "steps": []}), "[" * 100_000,
                              json.dumps({"iteration": "0", "steps": []}), json.dumps({"iteration": 1, "steps": 3}),
                              json.dumps({"iteration": 1, "steps": [{"action": "go"}]})]) + "\n")
    assert read_episodes(eps) == [{"iteration": 0, "steps": []}, {"iteration": 1, "steps": [{"action": "go"}]}]
