"""experiments/teamtr_evidence.py on the tiny model: its runs are `slea compare` variant sub-runs (one per invocation,
finished runs reused, unfinished ones resumed, the same folders `slea compare --variant` reuses), `slea compare`'s
table and curves, and the team's per-stage table."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slea.testing.bench import load_script

pytest.importorskip("textworld")

ROOT = Path(__file__).resolve().parents[2]
SMOKE = "configs/teamtr_smoke.yaml"
TINY = ["train.iterations=2", "rollout.groups=1", "team.max_turns=2", "eval.games=1", "eval.episodes_per_game=2",
        "eval.before=true", "run.threads=1"]  # one thread: the tests share 2 cores


@pytest.fixture
def bench(tmp_path, monkeypatch):
    mod = load_script(ROOT / "experiments" / "teamtr_evidence.py")
    monkeypatch.setattr(mod, "RESULTS", tmp_path / "teamtr")
    return mod


def test_variants_share_the_config_and_the_single_agent_gets_the_same_env_moves(bench):
    team = bench.config_for("teamtr", 3, SMOKE, ["team.max_turns=6"])
    naive = bench.config_for("naive", 3, SMOKE, ["team.max_turns=6"])
    single = bench.config_for("single", 3, SMOKE, ["team.max_turns=6"])
    assert (team.team.rollouts, naive.team.rollouts, single.team.rollouts) == ("fresh", "stale", "fresh")
    assert team.team.task == naive.team.task == "textworld_planner_actor"
    assert single.team.task == "textworld_solo_actor" and single.team.max_turns == 3  # 3 moves, as the team's 6
    assert team.run.seed == 3 and Path(single.run.dir) == bench.run_dir("single", 3)
    assert bench.run_dir("naive", 1) == bench.RESULTS / "runs" / "naive-s1"  # `slea compare`'s layout
    assert bench.variants(SMOKE, ["team.max_turns=6"])["single"] == [
        "team.task=textworld_solo_actor", "team.rollouts=fresh", "team.max_turns=3"]
    # the preset of the comparison loads and passes the team trainer's checks
    from slea.trainer.team import check_team_config

    for v in bench.VARIANTS:
        check_team_config(bench.config_for(v, 0))


def test_runs_reused_and_the_table(bench, capsys):
    for variant, seed in [("teamtr", 0), ("naive", 0), ("single", 0), ("teamtr", 1)]:
        assert bench.train(variant, seed, SMOKE, TINY) == "trained"
    assert bench.train("teamtr", 0, SMOKE, TINY) == "reused"
    with pytest.raises(SystemExit, match="another config"):
        bench.train("teamtr", 0, SMOKE, [*TINY, "train.lr=0.1"])
    # an unfinished run (no eval/summary.json; killed after its 4th update, before that update's checkpoint
    # iter_000004) is resumed: the 4th update is redone from the 3rd's checkpoint, and the run ends as the
    # uninterrupted one did
    d = bench.run_dir("naive", 0)
    want = (d / "eval" / "after.json").read_text()
    (d / "eval" / "summary.json").unlink()
    shutil.rmtree(d / "checkpoints" / "iter_000004")
    assert bench.train("naive", 0, SMOKE, TINY) == "resumed"
    assert "resuming" in capsys.readouterr().out
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]  # 2 stages x 2 agents, not appended to
    assert json.loads((d / "eval" / "after.json").read_text())["sampled"] == json.loads(want)["sampled"]

    tab = bench.table(SMOKE, TINY)
    out = bench.RESULTS
    assert (out / "stages.png").stat().st_size > 0 and json.loads((out / "stages.json").read_text()) == tab
    # slea compare's own table of the same runs: rollouts and env steps as the runs counted them
    std = json.loads((out / "table.json").read_text())
    assert list(std["algorithms"]) == ["teamtr", "naive", "single"] and (out / "curves.png").stat().st_size > 0
    assert std["algorithms"]["teamtr"]["rollouts"]["values"] == [12.0, 12.0]
    assert std["algorithms"]["naive"]["env_steps"]["values"] == [float(json.loads(
        (bench.run_dir("naive", 0) / "eval/summary.json").read_text())["env_steps"])]
    assert std["spec"]["variants"]["single"][-1] == "team.max_turns=1" and "| variant | seeds |" in (
        out / "table.md").read_text()
    v = tab["variants"]
    assert list(v) == ["teamtr", "naive", "single"] and v["teamtr"]["seeds"] == [0, 1]
    assert v["teamtr"]["heldout_success"]["n"] == 2 and v["single"]["heldout_success"]["n"] == 1
    assert v["teamtr"]["updates"]["mean"] == 4 and v["single"]["updates"]["mean"] == 2  # 2 stages x n agents
    # training episodes: TeamTR plays n + 1 = 3 collections of 2 episodes per stage, naive and single 2
    assert (v["teamtr"]["episodes"]["mean"], v["naive"]["episodes"]["mean"], v["single"]["episodes"]["mean"]) == (
        12, 8, 8)
    # the same seed gives teamtr and naive the same tasks and the same untrained team: the same first collection
    # and the same untrained held-out numbers
    rows = {n: [json.loads(x) for x in (bench.run_dir(n, 0) / "metrics.jsonl").read_text().splitlines()]
            for n in ("teamtr", "naive")}
    assert rows["teamtr"][0]["team/return_before"] == rows["naive"][0]["team/return_before"]
    s0 = {n: v[n]["per_seed"]["0"] for n in ("teamtr", "naive")}
    assert s0["teamtr"]["heldout_return_before"] == s0["naive"]["heldout_return_before"]
    assert len(s0["teamtr"]["train_return_per_stage"]) == 2
    md = (out / "stages.md").read_text()
    assert "| teamtr | 0, 1 |" in md and "| single | 0 |" in md and " ± " in md
    # each variant against teamtr and each variant's gain, paired by seed, with p and a CI over seeds and games
    pairs = {(c["a"], c["b"]): c for c in tab["pairs"]}
    assert {("naive", "teamtr"), ("single", "teamtr"), ("teamtr after", "teamtr before")} <= set(pairs)
    assert pairs[("naive", "teamtr")]["n"] == 1 and pairs[("naive", "teamtr")]["p_min"] == 1.0
    assert pairs[("teamtr after", "teamtr before")]["n"] == 2 and pairs[("teamtr after", "teamtr before")][
        "ci_method"] == "seeds, then games"
    assert "p (exact sign-flip)" in md and "| naive − teamtr | 1 |" in (out / "table.md").read_text()
    # the trust region's table of the same runs: the default estimator, every update of the run counted
    t = s0["teamtr"]["trust"]
    assert t["kl_estimator"] == "k3" and t["updates"] == 4 and 0 <= t["updates_reverted"] <= t["updates_stepped"]
    assert "| variant | d̂ estimator |" in md and "| teamtr | k3 |" in md

    # `slea compare` with the bench's variants reuses the bench's runs: nothing is trained again
    args = ["compare", str(ROOT / SMOKE), "--seeds", "0", "--out", str(out),
            *[x for v, over in bench.variants(SMOKE, TINY).items() for x in ("--variant", f"{v}:{','.join(over)}")],
            *[x for o in TINY for x in ("--set", o)]]
    r = subprocess.run([sys.executable, "-m", "slea.cli", *args], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(ROOT / "src")), check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("finished, reused") == 3 and ": training" not in r.stdout


def test_trust_stats_of_hand_made_rows(bench, tmp_path):
    # 4 updates: a planner step kept at d̂ .004 (the largest d̂ measured .004), an actor update reverted after
    # reaching .03, a planner update with no step, an actor step kept at .008 (.009 measured on its way)
    rows = [
        {"role": "planner", "teamtr/steps": 1, "teamtr/reverted": 0.0, "teamtr/token_kl": 0.004, "teamtr/kl_max": 0.004,
         "teamtr/kl_estimator": "k3", "teamtr/kl_messages": 20, "teamtr/samples": 20, "teamtr/beta_next": 0.005},
        {"role": "actor", "teamtr/steps": 3, "teamtr/reverted": 1.0, "teamtr/token_kl": 0.0, "teamtr/kl_max": 0.03,
         "teamtr/kl_estimator": "k3", "teamtr/kl_messages": 16, "teamtr/samples": 10, "teamtr/beta_next": 0.08},
        {"role": "planner", "teamtr/steps": 0, "teamtr/reverted": 0.0, "teamtr/token_kl": 0.0, "teamtr/kl_max": 0.0,
         "teamtr/kl_estimator": "k3", "teamtr/kl_messages": 12, "teamtr/samples": 0, "teamtr/beta_next": 0.005},
        {"role": "actor", "teamtr/steps": 2, "teamtr/reverted": 0.0, "teamtr/token_kl": 0.008, "teamtr/kl_max": 0.009,
         "teamtr/kl_estimator": "k3", "teamtr/kl_messages": 18, "teamtr/samples": 18, "teamtr/beta_next": 0.04},
    ]
    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.jsonl").write_text("".join(json.dumps({"iteration": i, **r}) + "\n" for i, r in enumerate(rows)))
    t = bench.trust_stats(d)
    assert t == {"kl_estimator": "k3", "updates": 4, "updates_stepped": 3, "updates_reverted": 1,
                 "kl_accepted_min": 0.004, "kl_accepted_max": 0.008, "kl_measured_max": 0.03,
                 "kl_messages_mean": pytest.approx((20 + 16 + 18) / 3), "trained_messages_mean": pytest.approx(16.0),
                 "beta_final": {"planner": 0.005, "actor": 0.04}}
    md = bench.trust_markdown({"variants": {"teamtr": {"seeds": [0], "per_seed": {"0": {"trust": t}}}}})
    assert "| teamtr | k3 | 18.0 / 16.0 | 1 / 3 | 0.0040 … 0.0080 | 0.0300 | 0.005 … 0.040 |" in md
