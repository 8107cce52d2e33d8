"""``slea agent --trace``: one row per step played, with the retrieved experiences' text."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from slea.evaluation.agent import run_agent, trace_rows
from slea.experience.manager import ExperienceManager
from slea.types import Step, Trajectory

SETTINGS = ["model.name_or_path=tiny", "model.lora=false", "env.id=slea/Sokoban-v0", "env.kwargs={}",
            "env.eval_kwargs={}", "env.max_steps=2", "rollout.max_new_tokens=4", "eval.games=2",
            "eval.episodes_per_game=1", "eval.greedy=true", "experience.mode=step", "experience.warmup_iters=0",
            "experience.min_entries=0"]


def _step(step: int, action: str, *, ids=(), valid=True, reward=0.0, done=False, cid=-1) -> Step:
    return Step(group_id=0, traj_id=3, step=step, anchor=f"room {step}", prompt_ids=[], response_ids=[],
                old_logprobs=[], reward=reward, done=done, valid=valid, action=action, response_text=f" {action}!",
                cluster_id=cid, experience_ids=list(ids))


def test_rows_by_hand_with_a_gone_entry():
    lib = {1: SimpleNamespace(zone="pos", text="'clap' earned the reward."),
           2: SimpleNamespace(zone="neg", text="Avoid 'bow'.")}
    t = Trajectory(group_id=0, traj_id=3, seed=7, won=True,
                   steps=[_step(0, "clap", ids=[1, 2], reward=0.5, cid=4),
                          _step(1, "", ids=[9], valid=False, reward=-0.1, done=True, cid=5)])
    rows = trace_rows("with", {"greedy": [t], "sampled": []}, lib.get, round_=2)
    assert len(rows) == 2
    assert rows[0] == {"condition": "with", "mode": "greedy", "round": 2, "seed": 7, "traj_id": 3, "step": 0,
                       "anchor": "room 0", "action": "clap", "response": " clap!", "valid": True, "reward": 0.5,
                       "done": False, "won": True, "cluster_id": 4,
                       "experiences": [{"id": 1, "zone": "pos", "text": "'clap' earned the reward."},
                                       {"id": 2, "zone": "neg", "text": "Avoid 'bow'."}]}
    # entry 9 is no longer in the library: its id stays, its zone and text are None
    assert rows[1]["experiences"] == [{"id": 9, "zone": None, "text": None}]
    assert (rows[1]["valid"], rows[1]["done"], rows[1]["won"]) == (False, True, True)


def test_evolving_run_traces_every_step_of_both_conditions_with_the_texts_of_that_round(setup, tmp_path):
    cfg, gen, builder = setup
    with ExperienceManager(cfg.experience, tmp_path / "lib.sqlite") as m:
        res = run_agent(gen, builder, m, {"split": "heldout"}, rollout=cfg.rollout, env=cfg.env, eval_cfg=cfg.eval,
                        experience_mode=cfg.experience.mode, evolve=True, batch=1, trace=True)
        texts = {e.id: e.text for e in m.library.entries()}
    steps = res["steps"]
    for cond in ("without", "with"):
        for mode in ("sampled", "greedy"):
            mine = [r for r in steps if r["condition"] == cond and r["mode"] == mode]
            # one row per step: the summaries' episode length times episodes
            s = res[cond][mode]
            assert len(mine) == round(s["episode_len"] * s["episodes"])
            assert {r["seed"] for r in mine} == {0, 1} and {r["round"] for r in mine} == {0, 1}
    assert all(r["experiences"] == [] for r in steps if r["condition"] == "without")
    # round 0 plays from the empty library; round 1 retrieves what round 0 taught, texts as the library holds them
    got = [x for r in steps if r["condition"] == "with" and r["round"] == 1 for x in r["experiences"]]
    assert got and all(x["zone"] in ("pos", "neg") for x in got)
    assert all(x["text"] == texts[x["id"]] for x in got if x["id"] in texts)
    assert all(r["experiences"] == [] for r in steps if r["condition"] == "with" and r["round"] == 0)
    hit = [r for r in steps if r["condition"] == "with" and r["mode"] == "sampled"]
    assert sum(bool(r["experiences"]) for r in hit) / len(hit) == pytest.approx(
        res["with"]["sampled"]["retrieval_hit_rate"])
    json.dumps(steps)  # JSON-able as written


def test_cli_trace_writes_steps_jsonl(tmp_path, slea_cli):
    lib = tmp_path / "new.sqlite"
    r = slea_cli("agent", "--model", "tiny", "--library", lib, "--env", "slea/Sokoban-v0", "--evolve", "--trace",
                 "--games", "1", "--episodes", "1", "--set", "env.max_steps=2", "--set",
                 "rollout.max_new_tokens=4", "--set", "eval.greedy=false", "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "out/steps.jsonl").read_text().splitlines()]
    res = json.loads((tmp_path / "out/agent.json").read_text())
    assert "steps" not in res  # the rows go to steps.jsonl only
    assert {r["condition"] for r in rows} == {"without", "with"}
    for cond in ("without", "with"):
        s = res[cond]["sampled"]
        assert sum(r["condition"] == cond for r in rows) == round(s["episode_len"] * s["episodes"])
    assert "steps.jsonl" in r.stdout
