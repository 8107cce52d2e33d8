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
