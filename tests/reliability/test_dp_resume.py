"""Resume under data parallelism: a 2-process run with the base weights sharded (``train.fsdp``) or replicated,
interrupted after iteration 1's metrics row (before its checkpoint, as test_resume.py interrupts one process)
and resumed, equals the uninterrupted 2-process run: the same metrics rows and the same final LoRA weights, bit
for bit. The negative control, the same interrupted run resumed with a fresh optimizer, must differ: the
comparison can see a resume that restores less than it should.

The three runs (uninterrupted, interrupted + resumed, interrupted + resumed without the optimizer) share one
spawned group (slea/testing/dp_resume.py) on the tiny model of ``rel.tiny_config``. Slow: ``slea train --nproc 2
--set train.fsdp=true`` on the smoke preset, rank 0 SIGKILLed inside iteration 1's checkpoint, resumed with
``slea train --resume RUN`` (no ``--nproc``), equals the uninterrupted command's run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from slea.parallel.distributed import launch
from slea.runs import checkpoint as ckpt
from slea.runs.runlog import read_metrics
from slea.testing.dp_resume import KILL_AT, resume_rank_main

ROOT = Path(__file__).resolve().parents[2]


def _final(run: Path) -> tuple[str, dict[str, torch.Tensor]]:
    last = ckpt.latest_checkpoint(run / "checkpoints")
    return last.name, load_file(str(last / "trainable.safetensors"))


@pytest.mark.parametrize("fsdp", [True, False], ids=["fsdp", "replicated"])
def test_interrupted_two_process_run_resumes_to_the_uninterrupted_one(tmp_path, rel, fsdp):
    # 2 task groups (one per rank), 2 AdamW steps per iteration at a high rate, KL on (the sharded reference
    # pass), micro-batches of 2 (several lockstep passes per update)
    cfg = rel.tiny_config(algorithm={"kl_coef": 0.01},
                          train={"iterations": 3, "micro_batch": 2, "updates_per_iter": 2, "lr": 1e-2, "fsdp": fsdp})
    launch(resume_rank_main, 2, cfg, tmp_path)
    ref, run, no_opt = tmp_path / "ref", tmp_path / "run", tmp_path / "no_optimizer"

    for name in ("run", "no_optimizer"):  # every rank resumed after iteration 0's checkpoint, none started over
        assert [(tmp_path / f"{name}.start-rank{r}").read_text() for r in range(2)] == [str(KILL_AT)] * 2
    want_rows = read_metrics(ref / "metrics.jsonl")
    assert [r["iteration"] for r in want_rows] == [0, 1, 2]
    assert any(r.get("update/loss", 0.0) != 0.0 for r in want_rows[KILL_AT:]), "the resumed iterations must train"
    rel.assert_same_metrics(read_metrics(run / "metrics.jsonl"), want_rows)
    (name, want), (got_name, got) = _final(ref), _final(run)
    assert got_name == name == "iter_000003" and got.keys() == want.keys()  # after iteration 3 of 3
    start = load_file(str(ref / "checkpoints" / "iter_000002" / "trainable.safetensors"))
    assert any(not torch.equal(start[k], want[k]) for k in want), "the last iteration never moved the weights"
    # bit-exact: case 1 of slea.testing.numerics, both runs on this machine (the same CPU kind, the same thread
    # count and process count); another ISA or thread count reduces in another order
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert ckpt.trained_processes(run) == 2  # what `slea train --resume` restarts with when --nproc is not given

    # the negative control: resumed from the same checkpoint with AdamW's moments and step counts left fresh
    _, control = _final(no_opt)
    assert any(not torch.equal(control[k], want[k]) for k in want), \
        "a resume without the optimizer state gave the same weights: this test cannot see a lost optimizer"


def test_trained_processes_is_one_without_the_field_or_a_checkpoint(tmp_path):
    net = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(net.parameters())
    assert ckpt.trained_processes(tmp_path) == 1  # no checkpoint yet
    ckpt.save_checkpoint(tmp_path / "checkpoints", 0, net, opt)  # one process, or a checkpoint older than the field
    assert ckpt.trained_processes(tmp_path) == 1
    ckpt.save_checkpoint(tmp_path / "checkpoints", 1, net, opt, extra={"processes": 2})
    assert ckpt.trained_processes(tmp_path) == 2
    (tmp_path / "checkpoints" / "iter_000001" / "state.json").write_text("{}")  # damaged: the previous one counts
    assert ckpt.trained_processes(tmp_path) == 1


# -- the real thing: `slea train --nproc 2 --set train.fsdp=true`, rank 0 SIGKILLed inside a checkpoint -------------
def _slea(*args: str) -> list[str]:
    return [sys.executable, "-m", "slea.cli", *args]


@pytest.mark.slow
def test_sigkilled_fsdp_cli_run_resumes_without_nproc_to_the_uninterrupted_one(tmp_path, rel):
    pytest.importorskip("textworld")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    env.pop("SLEA_TEST_KILL_AT", None)
    # no evaluation is compared: none before training, the smallest after it
    over = ["--nproc", "2", "--set", "train.fsdp=true", "--set", "run.threads=1", "--set", "train.iterations=2",
            "--set", "rollout.fuzzy_cutoff=0.3", "--set", "eval.greedy=false", "--set", "eval.before=false",
            "--set", "eval.games=1", "--set", "eval.episodes_per_game=1",
            "--set", "plugins=[slea.testing.kill_checkpoint]"]
    smoke = str(ROOT / "configs/smoke.yaml")
    ref, run = tmp_path / "ref", tmp_path / "run"
    r = subprocess.run(_slea("train", smoke, "--set", f"run.dir={ref}", *over), env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    # the plugin is imported in the spawned rank 0 too: it kills itself inside iteration 1's checkpoint, and the
    # launcher ends the other rank
    r = subprocess.run(_slea("train", smoke, "--set", f"run.dir={run}", *over), env={**env, "SLEA_TEST_KILL_AT": "1"},
                       cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode != 0, r.stdout[-2000:]
    assert (run / "checkpoints" / ".tmp-iter_000002" / "manifest.json").is_file()  # killed mid-checkpoint
    assert [p.name for p in ckpt.list_checkpoints(run / "checkpoints")] == ["iter_000001"]

    r = subprocess.run(_slea("train", "--resume", str(run)), env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "(2 data-parallel processes)" in r.stdout and "resumed after iteration 1/" in r.stdout, r.stdout[-2000:]
    rel.assert_same_metrics(read_metrics(run / "metrics.jsonl"), read_metrics(ref / "metrics.jsonl"))
    (name, want), (got_name, got) = _final(ref), _final(run)
    assert got_name == name == "iter_000002" and got.keys() == want.keys()  # killed inside the last checkpoint
    assert all(torch.equal(got[k], want[k]) for k in want)
