"""Data parallelism: a 2-process update (gloo, spawned) on a fixed batch equals the 1-process update, with the
base weights replicated and with them sharded (FSDP2, ``train.fsdp``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_model

from slea.testing.ddp import (
    AGGS,
    MODEL,
    fixed_reference,
    fixed_update,
    fsdp_rank_main,
    model_from,
    rank_main,
    trainable,
)
from slea.trainer.distributed import DataParallel, launch, lockstep_passes


def untimed(metrics: dict) -> dict:
    """The metrics without the seconds a phase took (``*_s``: each process's own clock)."""
    return {k: v for k, v in metrics.items() if not k.endswith("_s")}


@pytest.fixture(scope="module")
def start_state(tmp_path_factory) -> Path:
    """The starting weights, LoRA B matrices made non-zero (so the first step moves A as well)."""
    from slea.policy.model import load_policy

    torch.manual_seed(0)
    model, _ = load_policy(MODEL)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    path = tmp_path_factory.mktemp("ddp") / "start.safetensors"
    save_model(model, str(path))  # the tied embedding / lm_head saved once
    return path


def test_shares_cover_the_batch_once():
    parts = [DataParallel(r, 3).share(list(range(8))) for r in range(3)]
    assert parts == [[0, 1], [2, 3, 4], [5, 6, 7]]  # floor(8r/3) = 0, 2, 5, 8
    assert DataParallel(0, 2).share([1]) == [] and DataParallel(1, 2).share([1]) == [1]
    assert DataParallel().main and not DataParallel(1, 2).main


def test_lockstep_passes_are_the_busiest_ranks():
    for n in range(1, 12):
        for world in (1, 2, 3):
            for mb in (1, 2, 4):
                busiest = max(-(-len(DataParallel(r, world).block(n)) // mb) for r in range(world))
                assert lockstep_passes(n, world, mb) == busiest, (n, world, mb)


def test_two_process_update_equals_one_process_update(start_state, tmp_path):
    torch.set_num_threads(1)
    start = trainable(model_from(start_state))
    launch(rank_main, 2, start_state, tmp_path)
    for agg in AGGS:
        want, want_met = fixed_update(start_state, agg, None)
        ranks = [load_file(tmp_path / f"{agg}-rank{r}.safetensors") for r in range(2)]
        mets = [json.loads((tmp_path / f"{agg}-rank{r}.json").read_text()) for r in range(2)]
        moved = max(float((want[n] - start[n]).abs().max()) for n in want)
        assert moved > 1e-3, "the update must move the weights for the comparison to mean anything"
        for n in want:
            assert torch.equal(ranks[0][n], ranks[1][n]), n  # every rank took the very same step
            torch.testing.assert_close(ranks[0][n], want[n], rtol=0, atol=1e-6, msg=f"{agg}: {n}")
        assert untimed(mets[0]) == untimed(mets[1]) and mets[0].keys() == want_met.keys()
        # under a per-sequence aggregation the loss's own token-mean diagnostics (clip fraction...) are
        # weighted by rows and so depend on the micro-batching; the loss, KL and gradient norm do not
        keys = untimed(want_met) if agg == "token-mean" else ("loss", "kl", "grad_norm")
        for key in keys:
            assert mets[0][key] == pytest.approx(want_met[key], rel=1e-5, abs=1e-7), (agg, key)


def test_sharded_two_process_update_equals_one_process_update(start_state, tmp_path):
    torch.set_num_threads(1)
    start = trainable(model_from(start_state))
    launch(fsdp_rank_main, 2, start_state, tmp_path)
    for r in range(2):  # each rank holds about half of the frozen base weights (dim-0 shards, padded)
        numel = json.loads((tmp_path / f"fsdp-numel-rank{r}.json").read_text())
        assert 0.45 * numel["full"] < numel["local"] < 0.55 * numel["full"], numel
    for mb in (2, 1):  # with micro-batches of 1 the 3-row mini-batch is 1 + 2 rows: rank 0 runs an idle pass
        for agg in AGGS:
            want, want_met = fixed_update(start_state, agg, None, micro_batch=mb)
            stem = f"fsdp-mb{mb}-{agg}"
            ranks = [load_file(tmp_path / f"{stem}-rank{r}.safetensors") for r in range(2)]
            mets = [json.loads((tmp_path / f"{stem}-rank{r}.json").read_text()) for r in range(2)]
            assert ranks[0].keys() == want.keys()  # the LoRA weights, whole (not shards) on every rank
            assert max(float((want[n] - start[n]).abs().max()) for n in want) > 1e-3
            for n in want:
                assert torch.equal(ranks[0][n], ranks[1][n]), n
                torch.testing.assert_close(ranks[0][n], want[n], rtol=0, atol=1e-6, msg=f"{stem}: {n}")
            assert untimed(mets[0]) == untimed(mets[1]) and mets[0].keys() == want_met.keys()
            keys = untimed(want_met) if agg == "token-mean" else ("loss", "kl", "grad_norm")
            for key in keys:
                assert mets[0][key] == pytest.approx(want_met[key], rel=1e-5, abs=1e-7), (stem, key)
        want_ref = fixed_reference(start_state, None, mb)
        for r in range(2):
            got = json.loads((tmp_path / f"fsdp-mb{mb}-ref-rank{r}.json").read_text())
            assert [len(row) for row in got] == [len(row) for row in want_ref]
            for g, w in zip(got, want_ref):
                assert g == pytest.approx(w, abs=1e-5)


def test_fsdp_refuses_what_cannot_work():
    from slea.config import ConfigError, RunConfig
    from slea.trainer.dp_checks import check_data_parallel

    cfg = RunConfig.model_validate({"train": {"fsdp": True}, "model": {"name_or_path": "tiny"},
                                    "rollout": {"groups": 2}})
    check_data_parallel(cfg, DataParallel(0, 2))  # LoRA over 2 processes: accepted
    with pytest.raises(ConfigError, match="train.fsdp: shards the base weights .* --nproc 2 or more"):
        check_data_parallel(cfg, DataParallel())
    no_lora = cfg.model_copy(update={"model": cfg.model.model_copy(update={"lora": False})})
    with pytest.raises(ConfigError, match="model.lora: false"):
        check_data_parallel(no_lora, DataParallel(0, 2))
    ppo = cfg.model_copy(update={"algorithm": cfg.algorithm.model_copy(update={"name": "ppo"})})
    with pytest.raises(ConfigError, match="train.fsdp: ppo's critic"):
        check_data_parallel(ppo, DataParallel(0, 2))
    check_data_parallel(cfg.model_copy(update={"train": cfg.train.model_copy(update={"fsdp": False})}),
                        DataParallel())  # without fsdp one process is fine


# -- devices and backends ---------------------------------------------------------------------------------------
def test_spawned_ranks_know_their_local_rank_and_join_a_gloo_group_on_cpu(tmp_path):
    from slea.testing.ddp import group_rank_main

    launch(group_rank_main, 2, tmp_path)
    for r in range(2):
        seen = json.loads((tmp_path / f"group-rank{r}.json").read_text())
        assert seen["local_rank"] == str(r) and seen["world_size"] == "2"
        assert seen["backend"] == "gloo" and not seen["object_group"]  # gloo alone: objects use the group itself
        assert seen["mesh"] == ["cpu", [2]]  # FSDP2's mesh on the model's device type, not the accelerator's
        assert seen["gathered"] == [{"rank": 0}, {"rank": 1}]


def test_a_gpu_group_is_nccl_with_a_gloo_group_for_objects(monkeypatch):
    """``init_group`` on a CUDA device, with torch.distributed recorded instead of run (CI has no GPU)."""
    import torch.distributed as dist

    from slea.trainer import distributed as D

    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", str(d))))
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.append(("init", backend)))
    monkeypatch.setattr(dist, "new_group", lambda backend, **kw: calls.append(("new_group", backend)) or "G")
    monkeypatch.setattr(D, "_OBJECT_GROUP", [])
    assert D.init_group("cuda:3") == "cpu:gloo,cuda:nccl"
    assert calls == [("set_device", "cuda:3"), ("init", "cpu:gloo,cuda:nccl"), ("new_group", "gloo")]
    assert D.object_group() == "G"
    calls.clear()
    assert D.init_group("cpu") == "gloo" and calls == [("init", "gloo")] and D.object_group() is None


def test_torchrun_ranks_take_cuda_local_rank(monkeypatch):
    from slea.trainer.distributed import rank_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setenv("LOCAL_RANK", "6")
    monkeypatch.setenv("WORLD_SIZE", "16")  # two nodes of eight
    assert rank_device("auto") == torch.device("cuda:6")
    assert rank_device("cuda") == torch.device("cuda:6")
    assert rank_device("cpu") == torch.device("cpu")
