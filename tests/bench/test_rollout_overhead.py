"""bench/rollout_overhead.py on the tiny model and 2 x 2 real TextWorld episodes of 3 turns: the JSON it
writes, finite figures, and a naive loop that played the collector's episodes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from slea.testing.bench import load_script

pytest.importorskip("textworld")

R = load_script(Path(__file__).resolve().parents[2] / "bench" / "rollout_overhead.py")
SMALL = ["rollout.groups=2", "rollout.group_size=2", "rollout.max_new_tokens=4", "env.max_steps=3",
         "run.threads=1", "env.kwargs={tasks: [coin_collector:1], num_games: 2}"]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "rollout_overhead.json"
    argv = ["--model", "tiny", "--iterations", "1", "--out", str(out)]
    for item in SMALL:
        argv += ["--set", item]
    R.main(argv)
    return json.loads(out.read_text())


def test_json_fields(result):
    assert {"date", "config", "model", "iterations", "rollout", "collector", "replay", "naive", "figures",
            "figures_range", "targets", "per_iteration", "loadavg_1min"} <= set(result)
    assert result["config"] == "configs/default.yaml" and result["model"] == "tiny"
    assert set(result["figures"]) == {"overhead_vs_generation", "overhead_vs_replay", "overhead_excl_env",
                                      "env_share", "speedup_vs_naive", "naive_generation_vs_batched"}
    assert result["targets"]["overhead_max"] == 0.10 and result["targets"]["speedup_min"] == 2.0
    assert len(result["per_iteration"]) == 1
    assert result["per_iteration"][0]["figures"] == pytest.approx(result["figures"])  # one iteration: the same
    assert len(result["per_iteration"][0]["collector"]["call_s"]) == result["collector"]["calls"]


def test_figures_are_finite_ratios(result):
    f = result["figures"]
    assert all(math.isfinite(v) for v in f.values())
    c = result["collector"]
    assert f["overhead_vs_generation"] == pytest.approx((c["wall_s"] - c["generation_s"]) / c["generation_s"])
    assert c["wall_s"] >= c["generation_s"] > 0 and f["speedup_vs_naive"] > 0


def test_replay_and_naive_play_the_same_work(result):
    c, n, r = result["collector"], result["naive"], result["replay"]
    assert c["episodes"] == n["episodes"] == 4
    assert r["calls"] == c["calls"] and r["answers"] == c["prompts"] == c["env_steps"]
    assert n["calls"] == n["env_steps"]  # one batch-1 call per turn
    # fp32 tiny model: same prompts, keys and numerics, so the same answers and episodes
    assert r["identical_answers"] == r["answers"]
    assert n["same_actions_episodes"] == n["episodes"] and n["env_steps"] == c["env_steps"]
