"""Paper-style tables per env family (numbers checked by hand), the eval JSON's table, `slea eval --env`
and `slea envs`' data column."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slea.evaluation import report as R
from slea.rollout.collector import final_info
from slea.types import Step, Trajectory

ROOT = Path(__file__).resolve().parents[2]


def traj(task_type="", won=False, rewards=(0.0,), invalid=0, **info) -> Trajectory:
    steps = [Step(group_id=0, traj_id=0, step=i, anchor="", prompt_ids=[], response_ids=[], old_logprobs=[],
                  reward=r, valid=i >= invalid) for i, r in enumerate(rewards)]
    return Trajectory(group_id=0, traj_id=0, task_type=task_type, steps=steps, won=won,
                      final_info={"won": won, **info})


def test_final_info_keeps_numbers_and_short_strings():
    info = {"won": True, "score": 87.5, "moves": 3, "split": "dev", "admissible_actions": ["a", "b"],
            "goal": "x" * 500, "walkthrough": ["go"], "scores": {"em": 1}}
    assert final_info(info) == {"won": True, "score": 87.5, "moves": 3, "split": "dev"}


def test_alfworld_success_per_task_type_and_all():
    trajs = ([traj("pick", True), traj("pick", False), traj("pick", True), traj("pick", True)]  # 75.0
             + [traj("look", False)] * 2  # 0.0
             + [traj("clean", True)]  # 100.0
             + [traj("heat", True), traj("heat", False)]  # 50.0
             + [traj("pick_two", True), traj("pick_two", False), traj("pick_two", False)])  # 33.3; no cool
    t = R.build_table("slea/ALFWorld-Gen-v0", {"untrained": trajs})
    assert t.family == "alfworld"
    assert t.columns == ["Pick", "Look", "Clean", "Heat", "Cool", "Pick2", "All"]
    assert t.value("untrained", "Pick") == 75.0 and t.value("untrained", "Look") == 0.0
    assert t.value("untrained", "Clean") == 100.0 and t.value("untrained", "Heat") == 50.0
    assert t.value("untrained", "Cool") is None
    assert t.value("untrained", "Pick2") == pytest.approx(100 / 3)
    assert t.value("untrained", "All") == pytest.approx(100 * 6 / 12)  # 6 wins of 12 episodes
    md = t.to_markdown()
    assert "| Model / method | Pick | Look | Clean | Heat | Cool | Pick2 | All | Episodes |" in md
    assert "| untrained | 75.0 | 0.0 | 100.0 | 50.0 | – | 33.3 | 50.0 | 12 |" in md


def test_webshop_score_and_success():
    trajs = [traj(won=True, score=100.0), traj(score=50.0), traj(score=25.0), traj(score=0.0)]
    t = R.build_table("webshop", [("greedy", trajs)])
    assert t.columns == ["Score", "Succ. %"]
    assert t.value("greedy", "Score") == pytest.approx(175 / 4)
    assert t.value("greedy", "Succ. %") == 25.0


def test_missing_or_nan_score_is_missing_not_zero(caplog):
    trajs = [traj(score=80.0), traj(), traj(score=float("nan"))]  # no score, NaN score: left out, not 0
    with caplog.at_level(logging.WARNING, logger="slea.evaluation.report"):
        t = R.build_table("webshop", {"a": trajs, "b": [traj(), traj(score=float("nan"))]})
    assert t.value("a", "Score") == 80.0 and t.value("b", "Score") is None
    assert "| b | – | 0.0 | 2 |" in t.to_markdown()
    assert any("2 of 3 episodes" in r.getMessage() for r in caplog.records)
    qa = R.build_table("search_qa", {"x": [traj("hotpotqa", em=1.0, f1=1.0), traj("nq")]})
    assert qa.value("x", "nq EM") is None and qa.value("x", "Avg EM") is None  # not averaged over hotpotqa alone
    assert R.PaperTable.fmt(R.Cell(float("nan"), 1)) == "–"


def test_scienceworld_seen_unseen_from_task_and_variation():
    from slea.envs.scienceworld import SPLIT_SIZES

    n_train, n_dev, _ = SPLIT_SIZES["boil"]
    trajs = [
        traj("boil", score=40, task="boil", variation=n_train, split="train"),  # dev: Seen (split key ignored)
        traj("boil", score=20, task="boil", variation=n_train + n_dev),  # test: Unseen
        traj("boil", score=100, won=True, task="boil", variation=n_train + 1),  # Seen
        traj("melt", score=10, split="test"),  # no (task, variation): the env's split
    ]
    t = R.build_table("slea/ScienceWorld-v0", {"m": trajs})
    assert t.value("m", "Seen") == 70.0 and t.value("m", "Unseen") == 15.0
    assert t.value("m", "All") == pytest.approx(170 / 4)
    assert t.value("m", "boil") == pytest.approx(160 / 3) and t.value("m", "melt") == 10.0  # per task (auto)
    assert t.columns[:2] == ["Seen", "Unseen"] and t.columns[-1] == "All"
    one = R.build_table("scienceworld", {"m": trajs[:1]}, per_task=False)
    assert one.columns == ["Seen"]  # one split evaluated: that split, no All


def test_search_qa_em_f1_per_dataset_and_average():
    trajs = [traj("hotpotqa", True, em=1.0, f1=1.0), traj("hotpotqa", em=0.0, f1=0.5),
             traj("nq", em=0.0, f1=0.2), traj("nq", em=0.0, f1=0.0), traj("nq", True, em=1.0, f1=1.0),
             traj("nq", em=0.0, f1=0.0)]
    t = R.build_table("search_qa", {"grpo": trajs})
    assert t.value("grpo", "hotpotqa EM") == 50.0 and t.value("grpo", "hotpotqa F1") == 75.0
    assert t.value("grpo", "nq EM") == 25.0 and t.value("grpo", "nq F1") == pytest.approx(30.0)
    assert t.value("grpo", "Avg EM") == pytest.approx(37.5) and t.value("grpo", "Avg F1") == pytest.approx(52.5)
    assert t.columns[-2:] == ["Avg EM", "Avg F1"]
    single = R.build_table("slea/SearchQA-v0", {"x": trajs[:2]})
    assert single.columns == ["hotpotqa EM", "hotpotqa F1"]


def test_sokoban_and_textworld_success_per_task_type():
    sok = R.build_table("slea/Sokoban-v0", {"a": [traj("sokoban", True), traj("sokoban"), traj("sokoban")]})
    assert sok.columns == ["All"] and sok.value("a", "All") == pytest.approx(100 / 3)
    tw = R.build_table("slea/TextWorld-v0", {"a": [traj("coin_collector", True), traj("coin_collector"),
                                                   traj("treasure_hunter", True)]})
    assert tw.columns == ["coin_collector", "treasure_hunter", "All"]
    assert tw.value("a", "coin_collector") == 50.0 and tw.value("a", "treasure_hunter") == 100.0
    assert tw.value("a", "All") == pytest.approx(200 / 3)


def test_generic_table_and_registry():
    @R.family_table("toy", title="Toy", last=("Mean",))
    def toy(trajs):
        return {"Mean": R.Cell(sum(t.episode_return for t in trajs) / len(trajs), len(trajs))}

    try:
        assert R.build_table("toy", {"a": [traj(rewards=(1.0, 2.0)), traj(rewards=(0.0,))]}).value("a", "Mean") == 1.5
    finally:
        R._LAYOUTS.pop("toy")
    assert R.family_of("no/such-env") == R.GENERIC
    g = R.build_table("no/such-env", {"a": [traj(won=True, rewards=(0.0, 1.0), invalid=1), traj(rewards=(-0.1,))]})
    assert g.value("a", "Success %") == 50.0 and g.value("a", "Return") == pytest.approx(0.45)
    assert g.value("a", "Invalid %") == pytest.approx(100 / 3) and g.value("a", "Len") == 1.5


def test_table_dict_round_trip_merge_and_rich():
    t = R.build_table("webshop", {"a": [traj(won=True, score=100.0)], "b": [traj(score=10.0)]})
    d = json.loads(json.dumps(t.to_dict()))
    back = R.PaperTable.from_dict(d)
    assert back.to_markdown() == t.to_markdown() == d["markdown"]
    m = R.merge([d, t], prefix=["run1", "run2"])
    assert [r.label for r in m.rows] == ["run1 a", "run1 b", "run2 a", "run2 b"]
    from rich.console import Console

    con = Console(record=True, width=120)
    con.print(t.to_rich(first="model"))
    text = con.export_text()
    assert "Score" in text and "100.0" in text


def test_evaluate_result_has_the_family_table(tiny_policy):
    from slea.config import EnvSection, EvalSection, RolloutSection
    from slea.evaluation.evaluate import evaluate
    from slea.policy.generation import HFGenerator
    from slea.policy.prompt_builder import PromptBuilder
    from slea.rollout.collector import RolloutCollector

    model, tok = tiny_policy
    rollout = RolloutSection(max_new_tokens=3)
    collector = RolloutCollector(HFGenerator(model, tok, dtype="float32"), PromptBuilder(tok), rollout, 2)
    res = evaluate(collector, EnvSection(id="slea/Sokoban-v0"), {"split": "heldout"},
                   EvalSection(games=2, episodes_per_game=1),
                   label="tiny", keep_trajectories=True)
    tab = res["table"]
    assert tab["family"] == "sokoban" and [r["label"] for r in tab["rows"]] == ["tiny sampled T=1", "tiny greedy"]
    assert all(r["episodes"] == 2 for r in tab["rows"])
    trajs = res["trajectories"]["sampled"]
    assert all(t.final_info.get("task_type") == "sokoban" and "won" in t.final_info for t in trajs)


def slea(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "slea.cli", *args], check=False, capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def test_cli_eval_other_env_prints_and_saves_the_table(tmp_path):
    r = slea("eval", str(ROOT / "configs/smoke.yaml"), "--env", "slea/Sokoban-v0", "--episodes", "1",
             "--out", str(tmp_path), "--set", "model.name_or_path=tiny", "--set", "model.lora=false",
             "--set", "env.max_steps=2", "--set", "eval.games=2", "--set", "rollout.max_new_tokens=3",
             "--set", "env.kwargs.dim=[5,5]")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Sokoban success %" in r.stdout and "sampled T=1" in r.stdout and "greedy" in r.stdout
    saved = json.loads((tmp_path / "eval" / "eval-heldout-Sokoban-v0.json").read_text())
    assert saved["env"] == "slea/Sokoban-v0" and saved["table"]["family"] == "sokoban"
    assert "| sampled T=1 |" in (tmp_path / "eval" / "eval-heldout-Sokoban-v0.md").read_text()


def test_cli_envs_lists_data_status():
    r = slea("envs")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "data found, per family" in r.stdout
    for fam in ("alfworld", "scienceworld", "search_qa", "sokoban", "textworld", "webshop"):
        assert fam in r.stdout
    assert "rooms generated from seeds" in r.stdout


def test_data_probes_are_cheap_and_never_raise(monkeypatch, tmp_path):
    from slea.envs import status

    monkeypatch.setenv("SLEA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "none"))
    before = set(sys.modules)
    lines = status.all_status()
    assert set(lines) >= {"textworld", "alfworld", "scienceworld", "search_qa", "webshop", "sokoban"}
    assert "no games cached" in lines["textworld"] and "generator in use" in lines["alfworld"]
    heavy = {"textworld", "alfworld", "scienceworld", "fanoutqa", "py4j", "faiss", "sentence_transformers"}
    assert not {m.split(".")[0] for m in set(sys.modules) - before} & heavy
    (tmp_path / "none" / "json_2.1.1" / "valid_unseen").mkdir(parents=True)
    assert "official set found" in status.data_status("alfworld")
    monkeypatch.setitem(status._DATA_PROBES, "boom", lambda: 1 / 0)
    assert status.data_status("boom").startswith("probe failed: ZeroDivisionError")
    assert status.data_status("unknown") == ""
