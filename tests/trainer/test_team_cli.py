"""``slea train`` on a team config, end to end: the CLI picks the team trainer from what the algorithm declares it
needs, writes the single-agent run folder layout, and a SIGKILLed team run resumed with ``slea train --resume``
equals an uninterrupted one.

The algorithm is a user's plugin (``test_plugin_team`` in tests/plugins/my_slea_plugin.py, ``needs=("team",)``),
so nothing can be keyed on the name ``teamtr``; it scores a task's two copies +1 and −1, so the updates train.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from slea.runs import checkpoint as ckpt
from slea.runs.runlog import read_metrics

pytest.importorskip("textworld")

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["plugins=[my_slea_plugin, slea.testing.kill_checkpoint]", "algorithm.name=test_plugin_team",
         "rollout.groups=1", "team.max_turns=2", "team.trust_region.min_steps=1", "team.trust_region.max_steps=2",
         "team.trust_region.kl_estimator=k3", "train.lr=0.001", "train.keep_checkpoints=4", "run.threads=1",
         "eval.games=1", "eval.episodes_per_game=2", "eval.before=true"]


def slea(*args: str, kill_at: int | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests/plugins")]))
    env.pop("SLEA_TEST_KILL_AT", None)
    if kill_at is not None:
        env["SLEA_TEST_KILL_AT"] = str(kill_at)
    return subprocess.run([sys.executable, "-m", "slea.cli", *args], env=env, capture_output=True, text=True,
                          timeout=600, check=False)


def _train(run: Path, kill_at: int | None = None) -> subprocess.CompletedProcess:
    over = [x for o in [*SMALL, f"run.dir={run}"] for x in ("--set", o)]
    return slea("train", str(ROOT / "configs/teamtr_smoke.yaml"), *over, kill_at=kill_at)


def _comparable(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in read_metrics(run / "metrics.jsonl")]


@pytest.fixture(scope="module")
def ref_run(tmp_path_factory):
    """An uninterrupted ``slea train`` of the team config: (its run folder, the finished process)."""
    ref = tmp_path_factory.mktemp("team") / "ref"
    return ref, _train(ref)


def test_slea_train_runs_a_team_into_the_single_agent_run_folder_layout(ref_run, slea_cli):
    ref, r = ref_run
    assert r.returncode == 0, r.stderr[-3000:]
    # the single-agent run folder layout
    for name in ("config.yaml", "metrics.jsonl", "curves.png", "eval/before.json", "eval/after.json",
                 "eval/summary.json", "adapters/planner.safetensors", "adapters/actor.safetensors"):
        assert (ref / name).is_file(), name
    assert list((ref / "events").iterdir()), "TensorBoard events"
    # named by the updates done, as the log lines count them: iter_000001 holds update 1 of 4
    assert [p.name for p in ckpt.list_checkpoints(ref / "checkpoints")] == [f"iter_{u:06d}" for u in range(1, 5)]
    rows = read_metrics(ref / "metrics.jsonl")
    assert [x["iteration"] for x in rows] == [0, 1, 2, 3]  # 2 stages x 2 agents, a row per single-agent update
    assert [x["stage"] for x in rows] == [0, 0, 1, 1] and all(x["teamtr/steps"] >= 1 for x in rows)
    want = load_file(str(ckpt.latest_checkpoint(ref / "checkpoints") / "trainable.safetensors"))
    assert any(bool(t.abs().max() > 0) for n, t in want.items() if "lora_B" in n), "the updates changed nothing"
    out = r.stdout
    assert f"run folder: {ref}" in out
    assert re.search(r"stage 1 rollout 1: \d+/2 turns, 2/2 episodes done \[\d+s\]", out), out[-3000:]
    assert re.search(r"stage 2/2 update 2/2 \((planner|actor)\)  return [-+]\d\.\d+ -> [-+]\d\.\d+  token KL", out)
    assert "held-out (untrained): sampled success" in out and "held-out (trained): sampled success" in out
    assert "held-out evaluation" in out and "episodes used: 12" in out  # the summary table; 3 collections x 2 x 2
    # `slea eval` loads one policy: a team run's checkpoint (an adapter per agent) is refused in one line, exit 2
    # (in this process: slea_cli, from the plugin's folder)
    r = slea_cli("eval", str(ref), cwd=ROOT / "tests/plugins")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "is a run of the team trainer" in r.stderr and "eval/after.json" in r.stderr


@pytest.mark.slow
def test_a_sigkilled_team_run_resumed_with_slea_train_resume_equals_the_uninterrupted_one(ref_run, tmp_path):
    ref, r = ref_run
    assert r.returncode == 0, r.stderr[-3000:]
    want = load_file(str(ckpt.latest_checkpoint(ref / "checkpoints") / "trainable.safetensors"))
    run = tmp_path / "run"
    r = _train(run, kill_at=1)  # killed inside update 1's checkpoint: mid-stage 0
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr[-3000:])
    assert (run / "checkpoints" / ".tmp-iter_000002" / "manifest.json").is_file()
    assert [p.name for p in ckpt.list_checkpoints(run / "checkpoints")] == ["iter_000001"]
    assert [x["iteration"] for x in read_metrics(run / "metrics.jsonl")] == [0, 1]

    r = slea("train", "--resume", str(run))
    assert r.returncode == 0, r.stderr[-3000:]
    assert ("resumed after stage 1/2, update 1/2 (checkpoints/iter_000001); continuing with stage 1/2, update 2/2"
            in r.stdout), r.stdout[-3000:]
    assert _comparable(run) == _comparable(ref)
    got = load_file(str(ckpt.latest_checkpoint(run / "checkpoints") / "trainable.safetensors"))
    assert got.keys() == want.keys() and all(torch.equal(got[n], want[n]) for n in want)
    a, b = (json.loads((d / "eval/after.json").read_text()) for d in (run, ref))
    assert a["sampled"] == b["sampled"] and a["per_game_wins"] == b["per_game_wins"]
