"""What data-parallel training (``slea train --nproc N``, torchrun) cannot split yet, and what ``train.fsdp``
needs: one-line :class:`ConfigError` refusals, checked before any process group or model is built."""

from __future__ import annotations

from slea.algorithms.registry import get_algorithm
from slea.config import ConfigError, RunConfig
from slea.parallel.distributed import DataParallel


def check_data_parallel(cfg: RunConfig, dp: DataParallel) -> None:
    """A :class:`ConfigError` for what data parallelism cannot split yet, and for ``train.fsdp`` settings that
    cannot work."""
    if cfg.train.fsdp:
        check_fsdp(cfg, dp)
    if dp.world == 1:
        return
    if cfg.model.generator == "openai":
        raise ConfigError("model.generator: openai serves one process's weights; data-parallel training generates "
                          "in-process (hf) or with one managed vLLM server per process (vllm)")
    check_rank_devices(cfg.run.device, dp.world)
    if cfg.rollout.groups < dp.world:
        raise ConfigError(f"rollout.groups: {cfg.rollout.groups} task groups cannot be shared by {dp.world} "
                          f"processes (at least one group each)")
    if cfg.algorithm.dynamic_sampling:
        raise ConfigError("algorithm.dynamic_sampling: not supported with more than one process yet (each rank "
                          "would refill from the same seeds)")
    spec = get_algorithm(cfg.algorithm.name)
    if "team" in spec.needs:  # the team trainer (slea/trainer/select.py) trains its agents in one process
        raise ConfigError(f"algorithm.name: {spec.name} is trained by the team trainer, which runs in one "
                          f"process: drop --nproc")
    if "snapshots" in spec.needs:
        raise ConfigError(f"algorithm.name: {spec.name} forks sibling rollouts from env snapshots, which is not "
                          f"split across processes yet: run it with one process")
    if cfg.experience.mode != "off":
        raise ConfigError(f"experience.mode: {cfg.experience.mode} keeps an experience library, which is not split "
                          f"across processes yet (each rank clusters its own observations, so the gathered batch "
                          f"would link lessons to other ranks' cluster ids): run it with one process")


def check_rank_devices(spec: str, world: int) -> None:
    """Every process of this machine gets a device of ``run.device`` (``cuda:N`` and more processes than GPUs
    are refused), checked for the last local rank before any process starts (slea/device.py)."""
    import os

    import torch

    from slea.device import resolve_device

    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    available = torch.cuda.is_available()
    resolve_device(spec, cuda_available=available, cuda_count=torch.cuda.device_count() if available else 0,
                   local_rank=local - 1, world=world)


def check_fsdp(cfg: RunConfig, dp: DataParallel) -> None:
    """``train.fsdp`` shards the frozen base weights of a LoRA policy over two or more processes."""
    if dp.world == 1:
        raise ConfigError("train.fsdp: shards the base weights over the processes of a data-parallel run: use "
                          "--nproc 2 or more (or torchrun)")
    if not cfg.model.lora:
        raise ConfigError("train.fsdp: shards frozen base weights and keeps the LoRA weights whole; a fully "
                          "fine-tuned policy (model.lora: false) is not supported")
    if "critic" in get_algorithm(cfg.algorithm.name).needs:
        raise ConfigError(f"train.fsdp: {cfg.algorithm.name}'s critic runs the policy's layers on each rank's own "
                          f"rows, which sharded layers cannot: drop train.fsdp")
