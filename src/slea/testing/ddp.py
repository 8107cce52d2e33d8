"""A fixed-batch policy update run in one process or in every rank of a data-parallel group, so the two can be
compared (tests/parallel/test_distributed.py). It lives in the package because spawned ranks import their entry
point by name, which a test module (imported by path) cannot offer.

Nothing in slea imports it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from safetensors.torch import load_model, save_file

from slea.config import AlgorithmSection, ModelSection, TrainSection
from slea.parallel.distributed import DataParallel, shard_frozen_base
from slea.testing.numerics import numerics_dtype
from slea.trainer.update import Sample, ppo_update, reference_logprobs

MODEL = ModelSection(name_or_path="tiny", dtype="float32", lora=True, lora_r=4, lora_alpha=8,
                     lora_targets=["q_proj", "v_proj"])
# Plain SGD, not AdamW: its step is linear in the gradient, so the one-process and the data-parallel update (the
# same function, summed in another order) stay within float32 rounding of each other; AdamW divides every gradient
# element by its own size, and a near-zero element rounded differently moves its weight by up to lr
# (slea.testing.numerics). lr 0.1 moves the weights by about 7e-3 in the fixed update.
TRAIN = TrainSection(lr=0.1, updates_per_iter=2, micro_batch=2)
AGGS = ("token-mean", "seq-mean-token-mean")


def fixed_samples(vocab: int) -> list[Sample]:
    """7 rows (mini-batches of 4 and 3: uneven shares on 2 ranks) sharing a 6-token prefix, with random
    responses, old/reference log-probs and advantages."""
    rng = random.Random(0)
    prefix = [rng.randrange(4, vocab) for _ in range(6)]
    out = []
    for _ in range(7):
        prompt = prefix + [rng.randrange(4, vocab) for _ in range(rng.randint(1, 5))]
        n = rng.randint(1, 4)
        out.append(Sample(prompt, [rng.randrange(4, vocab) for _ in range(n)],
                          old_logprobs=[-rng.uniform(3, 8) for _ in range(n)],
                          advantages=[rng.uniform(-1, 1) for _ in range(n)],
                          ref_logprobs=[-rng.uniform(3, 8) for _ in range(n)]))
    return out


def model_from(state: Path, device: str | torch.device | None = None):
    """The tiny LoRA policy with the weights saved at ``state`` (on ``device``; default the CPU)."""
    from slea.policy.model import load_policy

    model, _ = load_policy(MODEL)
    load_model(model, state)
    return model if device is None else model.to(device)


def trainable(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def fixed_update(state: Path, agg: str, dp: DataParallel | None, micro_batch: int = TRAIN.micro_batch,
                 fsdp: bool = False, device: str | torch.device | None = None
                 ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """One ``ppo_update`` (2 SGD steps, KL term on) from the saved weights: the trained weights and metrics
    (``fsdp``: with the base weights sharded over the group first; ``device``: the model's)."""
    torch.manual_seed(0)
    model = model_from(state, device)
    if fsdp:
        shard_frozen_base(model)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=TRAIN.lr)
    algo = AlgorithmSection(loss_agg=agg, kl_coef=0.1)
    train = TRAIN.model_copy(update={"micro_batch": micro_batch})
    met = ppo_update(model, opt, fixed_samples(model.config.vocab_size), algo, train, temperature=1.0,
                     dtype=numerics_dtype(), rng=random.Random(3), dp=dp)
    return trainable(model), met


def rank_main(state: Path, out: Path) -> None:
    """One rank's run (the entry point :func:`slea.parallel.distributed.launch` spawns): every aggregation in
    :data:`AGGS`, weights and metrics written to ``out`` as ``<agg>-rank<r>.safetensors`` / ``.json``."""
    torch.set_num_threads(1)
    dp = DataParallel.current()
    for agg in AGGS:
        weights, met = fixed_update(state, agg, dp)
        save_file(weights, out / f"{agg}-rank{dp.rank}.safetensors")
        (out / f"{agg}-rank{dp.rank}.json").write_text(json.dumps(met))


def fixed_reference(state: Path, dp: DataParallel | None, micro_batch: int, fsdp: bool = False) -> list[list[float]]:
    """The reference log-probs (adapters disabled) of :func:`fixed_samples`, computed in micro-batches."""
    model = model_from(state)
    if fsdp:
        shard_frozen_base(model)
    samples = fixed_samples(model.config.vocab_size)
    reference_logprobs(model, samples, micro_batch=micro_batch, temperature=1.0, dtype=numerics_dtype(), dp=dp)
    return [s.ref_logprobs for s in samples]


def fsdp_rank_main(state: Path, out: Path) -> None:
    """One rank's run with the base weights sharded (``train.fsdp``): for micro-batches of 2 and of 1 (the
    latter leaves one rank a pass short, so it runs an idle pass), the updated weights and metrics of every
    aggregation and the reference log-probs, written as ``fsdp-mb<m>-<agg>-rank<r>.*`` /
    ``fsdp-mb<m>-ref-rank<r>.json``; and the base weights' element count, whole and held by this rank, as
    ``fsdp-numel-rank<r>.json``."""
    torch.set_num_threads(1)
    dp = DataParallel.current()
    model = model_from(state)
    full = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    shard_frozen_base(model)
    local = sum(p.to_local().numel() for p in model.parameters() if not p.requires_grad)
    (out / f"fsdp-numel-rank{dp.rank}.json").write_text(json.dumps({"full": full, "local": local}))
    for mb in (2, 1):
        for agg in AGGS:
            weights, met = fixed_update(state, agg, dp, micro_batch=mb, fsdp=True)
            save_file(weights, out / f"fsdp-mb{mb}-{agg}-rank{dp.rank}.safetensors")
            (out / f"fsdp-mb{mb}-{agg}-rank{dp.rank}.json").write_text(json.dumps(met))
        ref = fixed_reference(state, dp, mb, fsdp=True)
        (out / f"fsdp-mb{mb}-ref-rank{dp.rank}.json").write_text(json.dumps(ref))


def group_rank_main(out: Path) -> None:
    """One rank's view of the group it was spawned into: its ``LOCAL_RANK``/``WORLD_SIZE``, the backend, the
    mesh FSDP2 would get for a CPU model, and an object gathered from every rank (``group-rank<r>.json``)."""
    import os

    import torch.distributed as dist

    from slea.parallel.distributed import device_mesh, object_group

    dp = DataParallel.current()
    mesh = device_mesh(torch.nn.Linear(2, 2))
    (out / f"group-rank{dp.rank}.json").write_text(json.dumps({
        "local_rank": os.environ.get("LOCAL_RANK"), "world_size": os.environ.get("WORLD_SIZE"),
        "backend": dist.get_backend(), "object_group": object_group() is not None,
        "mesh": [mesh.device_type, list(mesh.shape)], "gathered": dp.gather({"rank": dp.rank})}))


def smoke_rank_main(state: Path, out: Path, device: str) -> None:
    """bench/gpu_check.py's process-group smoke (one rank or more, spawned with ``run.device`` ``device``): the
    fixed update with the base weights sharded (FSDP2 on the rank's device mesh) against the same update
    unsharded in this process, where the LoRA weights and the base shards live, and an object gathered over the
    group of object collectives; ``smoke-rank<r>.json``."""
    import torch.distributed as dist

    from slea.device import model_device
    from slea.parallel.distributed import object_group, rank_device, shard_frozen_base

    dp = DataParallel.current()
    dev = rank_device(device)
    plain, _ = fixed_update(state, AGGS[0], None, device=dev)
    sharded, met = fixed_update(state, AGGS[0], dp, fsdp=True, device=dev)
    model = model_from(state, dev)
    shard_frozen_base(model)
    lora = {p.device.type for p in model.parameters() if p.requires_grad}
    shards = {p.to_local().device.type for p in model.parameters() if not p.requires_grad}
    (out / f"smoke-rank{dp.rank}.json").write_text(json.dumps({
        "device": str(dev), "model_device": str(model_device(model)), "backend": dist.get_backend(),
        "object_group": "gloo" if object_group() is not None or dist.get_backend() == "gloo" else None,
        "lora_devices": sorted(lora), "shard_devices": sorted(shards),
        "max_abs_diff": max(float((sharded[n] - plain[n]).abs().max()) for n in plain),
        "moved": max(float((plain[n] - trainable(model_from(state, dev))[n]).abs().max()) for n in plain),
        "loss": met["loss"], "gathered": dp.gather(dp.rank)}))
