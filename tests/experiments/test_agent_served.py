"""experiments/agent_served.py's commands and table on fake results (no model is loaded, no server started)."""

from __future__ import annotations

import json
from pathlib import Path

from slea.config import load_config
from slea.testing.bench import load_script

S = load_script(Path(__file__).resolve().parents[2] / "experiments" / "agent_served.py")


def _sets(args: list[str]) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == "--set"]


def _opt(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_each_condition_plays_what_the_study_says(tmp_path):
    out = tmp_path / "o"
    build = S.agent_args("recall", "served", "build", "http://127.0.0.1:1/v1", 8, 8, out)
    assert _opt(build, "--split") == "train" and "--evolve" in build and _opt(build, "--batch") == "4"
    assert _opt(build, "--library").endswith("recall/served/empty.sqlite")
    assert "model.generator=openai" in _sets(build) and "model.openai.base_url=http://127.0.0.1:1/v1" in _sets(build)
    static = S.agent_args("recall", "hf", "static", None, 8, 8, out)
    assert "--evolve" not in static and _opt(static, "--library").endswith("recall/hf/build/library.sqlite")
    assert not any(s.startswith("model.generator") for s in _sets(static))
    llm = S.agent_args("textworld", "served", "evolve_llm", "u", 8, 8, out)
    assert _opt(llm, "--batch") == "4" and "experience.extractor=llm" in _sets(llm)
    assert _opt(S.agent_args("textworld", "hf", "build", None, 8, 8, out), "--batch") == "1"
    # every family's settings are valid config overrides
    for fam, spec in S.FAMILIES.items():
        cfg = load_config(None, [f"env.id={spec['env']}", "env.kwargs={}", *spec["set"], *spec["build"]],
                          check_unused=False)
        assert cfg.env.id == spec["env"], fam


def _result(success: float, hit: float) -> dict:
    s = {"success": success, "episodes": 64.0, "invalid_rate": 0.1, "retrieval_hit_rate": hit}
    return {"without": {"sampled": {**s, "retrieval_hit_rate": 0.0}}, "with": {"sampled": s},
            "games_by_success": {"sampled": {"better": 1, "worse": 0, "same": 7}}}


def test_the_table_marks_served_equal_to_hf_only_when_the_numbers_are(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "OUT", tmp_path)
    for engine, success in (("served", 0.25), ("hf", 0.25)):
        d = tmp_path / "recall" / engine / "static"
        d.mkdir(parents=True)
        (d / "agent.json").write_text(json.dumps(_result(success, 0.5)))
    d = tmp_path / "recall" / "hf" / "evolve"
    d.mkdir(parents=True)
    (d / "agent.json").write_text(json.dumps(_result(0.5, 0.5)))
    (tmp_path / "recall" / "served" / "evolve").mkdir()
    (tmp_path / "recall" / "served" / "evolve" / "agent.json").write_text(json.dumps(_result(0.375, 0.5)))
    table = S.table()
    assert "## recall" in table and "## textworld" not in table  # a family with no results has no section
    rows = {line.split(" | ")[0]: line for line in table.splitlines() if line.startswith("| ")}
    assert rows["| served: library from `build`"].endswith("| identical |")
    assert rows["| served: library from `build`, evolving"].endswith("| differs |")
    assert "0.375 (64)" in rows["| served: library from `build`, evolving"]
