"""Where a run's tensors live: ``run.device`` resolved once, and the few facts derived from it.

``run.device`` is ``auto``, ``cpu``, ``cuda`` or ``cuda:N``. :func:`resolve_device` (pure: what torch sees is
passed in) turns it into one device string: ``auto`` is ``cuda:$LOCAL_RANK`` when CUDA is available and ``cpu``
otherwise; ``cuda`` is ``cuda:$LOCAL_RANK``; ``cuda:N`` is that GPU (one process only: several ranks on one GPU
cannot form an NCCL group). A CUDA device that torch cannot see is a :class:`~slea.config.ConfigError` naming
``run.device``, raised before any model loads. :func:`run_device` reads torch and the environment and calls it.

Everything else takes the device from the model (:func:`model_device`): the policy, reference, critic head and
team adapters are put on the run's device when they are built, and every tensor of generation, update,
alignment and evaluation is made on its model's device. :func:`backend_for` is the process-group backend of a
device (gloo on CPU; ``cpu:gloo,cuda:nccl`` on GPUs, so CPU tensors still have a backend).
"""

from __future__ import annotations

import os
import re

import torch

from slea.config import ConfigError

DEVICE_PATTERN = r"^(auto|cpu|cuda(:\d+)?)$"
_CUDA_N = re.compile(r"^cuda:(\d+)$")


def resolve_device(spec: str, *, cuda_available: bool, cuda_count: int, local_rank: int = 0,
                   world: int = 1) -> str:
    """The device ``run.device: spec`` names for the process of local rank ``local_rank`` (of ``world``
    processes) on a machine where torch sees ``cuda_count`` CUDA devices (``cuda_available``): ``"cpu"`` or
    ``"cuda:N"``. A device that is not there is a :class:`ConfigError` naming ``run.device``."""
    if not re.match(DEVICE_PATTERN, spec):
        raise ConfigError(f"run.device: expected auto, cpu, cuda or cuda:N (got {spec!r})")
    if spec == "cpu" or (spec == "auto" and not cuda_available):
        return "cpu"
    if not cuda_available or cuda_count < 1:
        raise ConfigError(f"run.device: {spec}, but torch {torch.__version__} sees no CUDA device (a CPU build "
                          f"of torch, or no GPU visible); use run.device=cpu or auto")
    m = _CUDA_N.match(spec)
    if m:
        index = int(m.group(1))
        if world > 1:
            raise ConfigError(f"run.device: {spec} puts all {world} data-parallel processes on one GPU; use cuda "
                              f"or auto (each process on cuda:LOCAL_RANK)")
    else:
        index = local_rank
    if index >= cuda_count:
        what = f"local rank {local_rank} has" if not m else f"{spec} is"
        raise ConfigError(f"run.device: {spec}: {what} no GPU (torch sees {cuda_count}: cuda:0..cuda:"
                          f"{cuda_count - 1})")
    return f"cuda:{index}"


def local_rank() -> int:
    """This process's index on its machine (``LOCAL_RANK``, set by torchrun and by ``slea train --nproc``)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def run_device(spec: str) -> torch.device:
    """:func:`resolve_device` for this process: what torch sees, ``LOCAL_RANK`` and ``WORLD_SIZE``."""
    available = torch.cuda.is_available()
    return torch.device(resolve_device(spec, cuda_available=available,
                                       cuda_count=torch.cuda.device_count() if available else 0,
                                       local_rank=local_rank(), world=int(os.environ.get("WORLD_SIZE", "1"))))


def backend_for(device: str | torch.device) -> str:
    """The ``torch.distributed`` backend of a group whose collectives run on ``device``'s type."""
    return "cpu:gloo,cuda:nccl" if torch.device(device).type == "cuda" else "gloo"


def model_device(model) -> torch.device:
    """The device a model (or module) computes on: that of its first parameter (CPU for one without any, or for
    an object that is not a module)."""
    for p in getattr(model, "parameters", tuple)():
        return p.device
    for b in getattr(model, "buffers", tuple)():
        return b.device
    return torch.device("cpu")


def resolve_base_storage(setting: str, *, device: str | torch.device, lora: bool, dtype: str) -> str:
    """How a model's frozen base weights are stored (``model.base_dtype``): ``float32``; ``bfloat16`` (every base
    weight, so the residual stream is bf16 too); or ``bfloat16_linears`` (only the frozen weights that feed a
    matmul, :func:`slea.policy.model.store_frozen_linears`: what bf16 autocast computes from an fp32 base, bit for
    bit, without a cast per forward call). ``auto``, when only LoRA adapters train and the compute precision
    (``model.dtype``) is bf16: ``bfloat16`` on CUDA, ``bfloat16_linears`` on the CPU (same numbers as fp32
    storage); ``float32`` otherwise. Trainable weights are always fp32."""
    if setting == "auto":
        if not (lora and dtype == "bfloat16"):
            return "float32"
        return "bfloat16" if torch.device(device).type == "cuda" else "bfloat16_linears"
    return setting


def resolve_base_dtype(setting: str, *, device: str | torch.device, lora: bool, dtype: str) -> torch.dtype:
    """The dtype the base model is loaded in (``model.base_dtype``, :func:`resolve_base_storage`): bf16 for a
    ``bfloat16`` base, fp32 otherwise (``bfloat16_linears`` casts its linears after loading)."""
    storage = resolve_base_storage(setting, device=device, lora=lora, dtype=dtype)
    return torch.bfloat16 if storage == "bfloat16" else torch.float32


def cuda_rng_states() -> list[torch.Tensor] | None:
    """Every CUDA device's generator state when CUDA has been initialised (a CPU run: ``None``)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.get_rng_state_all()
    return None
