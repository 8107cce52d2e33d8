"""Data parallelism: a 2-process update (gloo, spawned) on a fixed batch equals the 1-process update, with the
base weights replicated and with them sharded (FSDP2, ``train.fsdp``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_model

from slea.parallel.distributed import DataParallel, launch, lockstep_passes
from slea.testing.ddp import (
    AGGS,
    MODEL,
    TRAIN,
    fixed_reference,
    fixed_samples,
    fixed_update,
    fsdp_rank_main,
    model_from,
    rank_main,
    trainable,
)
from slea.testing.numerics import (
    assert_same,
    assert_within,
    gradient_tolerance,
    logprob_tolerance,
    numerics_dtype,
)

SAME_STEP = "every rank applies the same all-reduced gradient with the same optimizer to the same weights"


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


@pytest.fixture(scope="module")
def scales(start_state) -> dict:
    """What the case-2 bounds of slea.testing.numerics need about the fixed update (computed in numerics_dtype()):
    the model's depth and widths, its largest logit (adapted and base) and the largest r = ref − log π of the KL's
    tokens."""
    from slea.trainer.update import response_logprobs

    model = model_from(start_state)
    cfg = model.config
    samples = fixed_samples(cfg.vocab_size)
    with torch.no_grad():
        logits = [float(model(input_ids=torch.tensor([s.prompt_ids + s.response_ids])).logits.abs().max())
                  for s in samples]
        with model.disable_adapter():
            logits += [float(model(input_ids=torch.tensor([s.prompt_ids + s.response_ids])).logits.abs().max())
                       for s in samples]
        logp, mask = response_logprobs(model, samples, temperature=1.0, dtype="float32", share_prefix=False)
    r = max(ref - float(lp) for s, row, m in zip(samples, logp, mask)
            for ref, lp in zip(s.ref_logprobs, row[m.bool()]))
    return {"config": cfg, "max_logit": max(logits), "max_r": r,
            "max_adv": max(abs(a) for s in samples for a in s.advantages)}


def weight_bound(sc: dict, want_met: dict) -> float:
    """Case 2 for the trained weights: each SGD step moves a weight by lr · its gradient, and the gradient (summed
    over rows, micro-batches and ranks in another order and layout) is within gradient_tolerance of the
    one-process gradient, relative to its size, at most its norm; the steps' norms sum to (steps × the logged
    mean grad_norm)."""
    steps = TRAIN.updates_per_iter
    return TRAIN.lr * gradient_tolerance(numerics_dtype(), sc["config"], scale=steps * want_met["grad_norm"])


# Metrics compared bitwise: counts, the on-policy ratio (π_old is that forward's own output: case 1), and the clip
# fraction, a count of tokens past a threshold, equal unless a token's ratio lies within rounding of a clip edge
# (none does in the fixed batch; one would show as 1/84).
EXACT = ("trained_samples", "trained_tokens", "skipped_updates", "ratio_dev_onpolicy", "ratio_onpolicy_max_dev",
         "clip_frac")


def metric_bound(sc: dict, key: str, want: dict) -> float:
    """Case 2 for a logged metric, a mean (or max) over the mini-batch's tokens of terms of the log-probs, each
    log-prob within logprob_tolerance: the bound is that times the largest slope of a term per nat. The loss's
    terms ratio · A (ratio = e^(log π − log π_old), both recomputed, clipped at 1 + clip_eps): 2 (1 + clip_eps)
    max|A|, plus β = 0.1 times the KL's; k3's terms e^r − r − 1 (r = ref − log π, ref fixed): 1 + e^r_max; a ratio
    statistic: 2 · the largest ratio; the rollout mismatch |e^(log π − old) − 1| (old fixed): 1 + its largest
    value; the entropy: ln V + 2 max|logit| per nat of logit. grad_norm is a norm (no cancellation), within
    gradient_tolerance of its own size."""
    dtype = numerics_dtype()
    if key == "grad_norm":
        return gradient_tolerance(dtype, sc["config"], scale=want[key])
    kl = 1 + math.exp(sc["max_r"])
    ratio = 2 * (1 + want.get("ratio_max_dev", 0.2))
    per_nat = {"loss": 2 * 1.2 * sc["max_adv"] + 0.1 * kl, "kl": kl, "approx_kl": 2 * ratio, "ratio_mean": ratio,
               "ratio_dev_mean": ratio, "ratio_max_dev": ratio,
               "mismatch_dev_mean": 1 + want.get("mismatch_max_dev", 0.0),
               "mismatch_max_dev": 1 + want.get("mismatch_max_dev", 0.0),
               "entropy": math.log(sc["config"].vocab_size) + 2 * sc["max_logit"]}[key]
    return per_nat * logprob_tolerance(dtype, sc["config"], max_logit=sc["max_logit"])


def assert_metrics(got: dict, want: dict, keys, sc: dict, where: str) -> None:
    for key in keys:
        if key in EXACT:
            assert_same(got[key], want[key], why=f"{where}: {key}, a count or an exact 0")
        else:
            assert_within(got[key], want[key], metric_bound(sc, key, want), why=f"{where}: {key}")


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


def test_two_process_update_equals_one_process_update(start_state, scales, tmp_path):
    """Case 2 of slea.testing.numerics against the one-process update (each rank sums its own rows' gradients,
    then the ranks' sums are added: another reduction order); case 1 between the ranks."""
    torch.set_num_threads(1)
    start = trainable(model_from(start_state))
    launch(rank_main, 2, start_state, tmp_path)
    for agg in AGGS:
        want, want_met = fixed_update(start_state, agg, None)
        ranks = [load_file(tmp_path / f"{agg}-rank{r}.safetensors") for r in range(2)]
        mets = [json.loads((tmp_path / f"{agg}-rank{r}.json").read_text()) for r in range(2)]
        moved = max(float((want[n] - start[n]).abs().max()) for n in want)
        assert moved > 1e-3, "the update must move the weights for the comparison to mean anything"
        bound = weight_bound(scales, want_met)
        # in float32 the bound is far below what a dropped row or shard changes (bf16's worst case is not)
        assert numerics_dtype() != "float32" or bound < 0.01 * moved
        for n in want:
            assert_same(ranks[0][n], ranks[1][n], why=f"{n}: {SAME_STEP}")
            assert_within(ranks[0][n], want[n], bound, why=f"{agg}: {n}, two ranks against one process")
        assert untimed(mets[0]) == untimed(mets[1]) and mets[0].keys() == want_met.keys()
        # under a per-sequence aggregation the loss's own token-mean diagnostics (clip fraction...) are
        # weighted by rows and so depend on the micro-batching; the loss, KL and gradient norm do not
        keys = untimed(want_met) if agg == "token-mean" else ("loss", "kl", "grad_norm")
        assert_metrics(mets[0], want_met, keys, scales, agg)


def test_sharded_two_process_update_equals_one_process_update(start_state, scales, tmp_path):
    """Case 2 of slea.testing.numerics against the one-process update: the sharded ranks run no shared-prefix
    forward, their own micro-batches, and add their gradient sums (another layout and reduction order); case 1
    between the ranks."""
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
            moved = max(float((want[n] - start[n]).abs().max()) for n in want)
            bound = weight_bound(scales, want_met)
            assert moved > 1e-3 and (numerics_dtype() != "float32" or bound < 0.01 * moved)
            for n in want:
                assert_same(ranks[0][n], ranks[1][n], why=f"{n}: {SAME_STEP}")
                assert_within(ranks[0][n], want[n], bound, why=f"{stem}: {n}, two sharded ranks against one process")
            assert untimed(mets[0]) == untimed(mets[1]) and mets[0].keys() == want_met.keys()
            keys = untimed(want_met) if agg == "token-mean" else ("loss", "kl", "grad_norm")
            assert_metrics(mets[0], want_met, keys, scales, stem)
        want_ref = fixed_reference(start_state, None, mb)
        # case 2: a token's log-prob by the sharded ranks (no shared prefix, their own micro-batches) and by one
        # process
        ref_bound = logprob_tolerance(numerics_dtype(), scales["config"], max_logit=scales["max_logit"])
        for r in range(2):
            got = json.loads((tmp_path / f"fsdp-mb{mb}-ref-rank{r}.json").read_text())
            assert [len(row) for row in got] == [len(row) for row in want_ref]
            assert_within(got, want_ref, ref_bound, why=f"mb{mb}: reference log-probs of rank {r}'s gather")


def test_fsdp_refuses_what_cannot_work():
    from slea.config import ConfigError, RunConfig
    from slea.parallel.checks import check_data_parallel

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

    from slea.parallel import distributed as D

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
    from slea.parallel.distributed import rank_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setenv("LOCAL_RANK", "6")
    monkeypatch.setenv("WORLD_SIZE", "16")  # two nodes of eight
    assert rank_device("auto") == torch.device("cuda:6")
    assert rank_device("cuda") == torch.device("cuda:6")
    assert rank_device("cpu") == torch.device("cpu")
