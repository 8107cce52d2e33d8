"""``slea compare`` on a team config: team sub-runs are trained by the trainer ``slea train`` picks (the algorithm's
declared needs, never its name), and the table and curves come from their metrics and evaluations.

``test_plugin_team`` (tests/plugins/my_slea_plugin.py) is a user's algorithm that needs a team; ``teamtr`` is
TeamTR itself. The tiny model on the TeamTR smoke preset cut to one task group and two messages per episode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slea.runs.runlog import read_metrics

pytest.importorskip("textworld")

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["plugins=[my_slea_plugin]", "rollout.groups=1", "team.max_turns=2", "team.trust_region.min_steps=1",
         "team.trust_region.max_steps=1", "team.trust_region.kl_estimator=k3", "train.lr=0.001", "run.threads=1",
         "eval.games=1", "eval.episodes_per_game=2"]
NO_PLUGIN = SMALL[1:]  # TeamTR alone needs no plugin


def slea(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests/plugins")]))
    return subprocess.run([sys.executable, "-m", "slea.cli", *args], env=env, capture_output=True, text=True,
                          timeout=600, check=False)


def _compare(out: Path, algorithms: str, *extra: str) -> subprocess.CompletedProcess:
    over = [x for o in [*SMALL, *extra] for x in ("--set", o)]
    return slea("compare", str(ROOT / "configs/teamtr_smoke.yaml"), "--algorithms", algorithms, "--seeds", "0,1",
                "--out", str(out), *over)


def test_slea_compare_trains_team_sub_runs_and_tables_their_metrics(tmp_path, slea_cli):
    # in this process (slea_cli, run from the plugin's folder; `slea compare` trains its sub-runs in its own
    # process anyway): two interpreters less; the refusals below run the real command
    def compare() -> subprocess.CompletedProcess:
        over = [x for o in SMALL for x in ("--set", o)]
        return slea_cli("compare", ROOT / "configs/teamtr_smoke.yaml", "--algorithms", "teamtr,test_plugin_team",
                        "--seeds", "0,1", "--out", out, *over, cwd=ROOT / "tests/plugins")

    out = tmp_path / "cmp"
    r = compare()
    assert r.returncode == 0, r.stderr[-3000:]
    for name in ("table.md", "table.json", "curves.png", "compare.json"):
        assert (out / name).is_file(), name
    table = json.loads((out / "table.json").read_text())
    assert list(table["algorithms"]) == ["teamtr", "test_plugin_team"]
    for algo, a in table["algorithms"].items():
        assert a["status"] == {"0": "trained", "1": "trained"}
        for seed in (0, 1):
            run = out / "runs" / f"{algo}-s{seed}"
            rows = read_metrics(run / "metrics.jsonl")
            assert [x["stage"] for x in rows] == [0, 0, 1, 1]  # a team run: a row per single-agent update
            summary = json.loads((run / "eval/summary.json").read_text())
            # 2 stages × 3 fresh collections × 2 episodes
            assert summary["episodes"] == 12 and rows[-1]["rollouts"] == 12
            assert rows[-1]["env_steps"] == summary["env_steps"]
        assert a["rollouts"]["mean"] == 12 and a["iterations"]["mean"] == 4
        assert a["env_steps"]["values"] == [float(json.loads((out / "runs" / f"{algo}-s{s}" / "eval/summary.json")
                                                              .read_text())["env_steps"]) for s in (0, 1)]
        assert a["heldout_success"]["n"] == 2 and a["final_train_success"]["n"] == 2
        assert a["heldout_greedy_success"]["mean"] is None  # eval.greedy is off in the preset: shown as "–"
    md = (out / "table.md").read_text()
    assert "| teamtr | 2 |" in md and "| test_plugin_team | 2 |" in md and "–" in md
    # the user's algorithm trained (its signal), so the seeds' adapters differ from TeamTR's untrained ones
    plugin_rows = read_metrics(out / "runs/test_plugin_team-s0/metrics.jsonl")
    assert all(x["teamtr/steps"] >= 1 and x["teamtr/samples"] > 0 for x in plugin_rows)

    r = compare()  # everything finished: reused, nothing trained again
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("finished, reused") == 4


def test_a_config_the_team_trainer_refuses_is_refused_before_any_sub_run_trains(tmp_path):
    # the team trainer's own check (slea.trainer.select.check_config) runs at planning, in one line, exit 2 (β is
    # the trust region's; teamtr's loss takes a beta, so the config check passes it)
    r = _compare(tmp_path / "cmp", "teamtr", "algorithm.options={beta: 0.5}")
    assert r.returncode == 2 and "Traceback" not in r.stderr and not (tmp_path / "cmp/runs").exists()
    assert "algorithm.options.beta: TeamTR adapts β" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_slea_compare_team_variants_at_a_matched_rollout_budget(tmp_path, slea_cli):
    # TeamTR's variants are settings of one config (team.rollouts), compared as `--variant LABEL:KEY=VALUE`; with
    # 2 episodes per collection, a rollout budget of 6 stops fresh (3 collections per stage) after stage 0's two
    # updates, and naive sequential training (2 per stage) after stage 1's first update (in this process)
    out = tmp_path / "cmp"
    over = [x for o in [*NO_PLUGIN, "train.rollout_budget=6"] for x in ("--set", o)]
    r = slea_cli("compare", str(ROOT / "configs/teamtr_smoke.yaml"), "--variant", "teamtr:team.rollouts=fresh",
                 "--variant", "naive:team.rollouts=stale", "--seeds", "0", "--out", str(out), *over)
    assert r.returncode == 0, r.stderr[-3000:]
    spec = json.loads((out / "compare.json").read_text())
    assert spec["variants"] == {"teamtr": ["team.rollouts=fresh"], "naive": ["team.rollouts=stale"]}
    table = json.loads((out / "table.json").read_text())
    assert list(table["algorithms"]) == ["teamtr", "naive"]
    for name, stages, mode in (("teamtr", [0, 0], "fresh"), ("naive", [0, 0, 1], "stale")):
        run = out / "runs" / f"{name}-s0"
        rows = read_metrics(run / "metrics.jsonl")
        summary = json.loads((run / "eval/summary.json").read_text())
        assert [x["stage"] for x in rows] == stages and summary["rollouts"] == mode
        assert summary["episodes"] == 6 and summary["stopped_by"].startswith("rollout budget of 6 (6 played)")
        assert sum(x["budget/rollouts"] for x in rows) == 6 and rows[-1]["rollouts"] == 6
        a = table["algorithms"][name]
        assert a["rollouts"]["values"] == [6.0] and a["iterations"]["values"] == [float(len(stages))]
        assert a["env_steps"]["values"] == [float(summary["env_steps"])]
    md = (out / "table.md").read_text()
    assert md.startswith("| variant | seeds |") and "| naive | 1 |" in md and "naive: team.rollouts=stale" in md


@pytest.mark.parametrize("args, says", [
    (["--algorithms", "teamtr,grpo"], "teamtr is trained by the team trainer and grpo by the rl trainer"),
    (["--variant", "a:team.rollouts=stale", "--variant", "b:eval.games=3"], "variant b: eval.games is the same"),
    (["--algorithms", "teamtr", "--variant", "a:team.rollouts=stale"], "give --algorithms or --variant, not both"),
    (["--variant", "naive"], "--variant 'naive': expected LABEL:KEY=VALUE"),
    (["--variant", "a:team.rollouts=stale", "--variant", "b:team.rollouts=fresh", "--set", "team.rollouts=stale_iw"],
     "--set team.rollouts: every variant of the comparison sets it"),
    (["--variant", "a:team.rollouts=stale", "--variant", "b:team.rollout=fresh"], "team.rollout: unknown key"),
])
def test_a_comparison_that_would_not_be_fair_is_refused_in_one_line(tmp_path, args, says, slea_cli):
    # in this process (slea_cli); test_a_config_the_team_trainer_refuses_... runs the real command
    r = slea_cli("compare", str(ROOT / "configs/teamtr_smoke.yaml"), "--seeds", "0", "--out", str(tmp_path / "cmp"),
                 *[x for o in NO_PLUGIN for x in ("--set", o)], *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert says in r.stderr and not (tmp_path / "cmp").exists()
