"""Resume under data parallelism: a 2-process run with the base weights sharded (``train.fsdp``) or replicated,
interrupted after iteration 1's metrics row (before its checkpoint, as test_resume.py interrupts one process)
and resumed, equals the uninterrupted 2-process run: the same metrics rows and the same final LoRA weights, bit
for bit. The negative control, the same interrupted run resumed with a fresh optimizer, must differ: the
comparison can see a resume that restores less than it should.

The three runs (uninterrupted, interrupted + resumed, interrupted + resumed without the optimizer) share one
spawned group (slea/testing/dp_resume.py) on the tiny model of ``rel.tiny_config``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from slea.testing.dp_resume import KILL_AT, resume_rank_main
from slea.trainer import checkpoint as ckpt
from slea.trainer.distributed import launch
from slea.trainer.runlog import read_metrics


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
    assert got_name == name == "iter_000002" and got.keys() == want.keys()
    start = load_file(str(ref / "checkpoints" / "iter_000001" / "trainable.safetensors"))
    assert any(not torch.equal(start[k], want[k]) for k in want), "the last iteration never moved the weights"
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
