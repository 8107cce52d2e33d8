"""Data parallelism over ``torch.distributed``: N processes, one update (``slea train --nproc N``, or torchrun).

Every rank holds the whole policy. A training batch is the same on every rank; each rank runs the forward and
backward passes of its contiguous share of each mini-batch's rows, with the loss weights of the *whole*
mini-batch (its token or row count), so the gradients summed over the ranks (one all-reduce of the flattened
trainable gradients per optimizer step) are the one-process gradient of that mini-batch, and the clipped step
that follows is the same on every rank. The update of N processes therefore equals the update of one process on
the same batch, up to float summation order (tests/parallel/test_distributed.py).

Why not ``torch.nn.parallel.DistributedDataParallel``: it averages gradients over ranks, and syncs inside one
backward per rank, while slea's micro-batches are uneven across ranks (a mini-batch of 5 rows is 3 + 2) and its
prefix-shared forward runs the model twice before one backward; the summed all-reduce after accumulation is the
same collective without those constraints.

Devices (``run.device``, slea/device.py): every rank works on ``cuda:LOCAL_RANK`` on a GPU node (``set_device``
before the group is made; ``slea train --nproc`` sets ``LOCAL_RANK`` for its spawned ranks as torchrun does) or
on the CPU. The group's backend is :func:`slea.device.backend_for` of that device: gloo on CPU,
``cpu:gloo,cuda:nccl`` on GPUs (gradients all-reduce over NCCL). Object collectives (episodes, metrics: pickled
rows, hundreds of MB) always go over a gloo group (:func:`object_group`), so they never travel through GPU memory.

Sharded base weights (``train.fsdp``, :func:`shard_frozen_base`): FSDP2's ``fully_shard`` splits each decoder
layer's frozen base weights (and the root's embeddings/head) across the ranks, and all-gathers a layer's
weights for its forward and backward only. The LoRA parameters are left out of the sharding (``ignored_params``):
they stay whole, plain tensors on every rank, so the gradient all-reduce above, the clipped optimizer step and
the checkpoint of the trainable weights are unchanged, and FSDP reduces no gradient itself (the base weights have
none), so nothing is summed twice. Every forward of a sharded module is a collective, so the ranks must run the
same number of forwards and backwards in the same order: the update pads a rank's micro-batches with zero-weight
passes (:func:`lockstep_passes`) and runs one forward per backward (no shared-prefix split), and rollouts and
evaluations, whose forward counts differ by rank, run inside :func:`full_weights`, with the base weights
gathered once and no collective per forward. The shards live on the rank's device: FSDP2 gets an explicit
one-dimensional device mesh of that type (:func:`device_mesh`), never torch's default accelerator mesh.
"""

from __future__ import annotations

import contextlib
import faulthandler
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")

# Rank 0 may evaluate or checkpoint while the other ranks wait at the next collective: allow that long.
COLLECTIVE_TIMEOUT = timedelta(hours=6)
_OBJECT_GROUP: list[Any] = []  # the gloo group of object collectives when the default group is not gloo


@dataclass(frozen=True)
class DataParallel:
    """This process's place in the data-parallel group: ``rank`` of ``world`` (``world == 1``: no group)."""

    rank: int = 0
    world: int = 1

    @classmethod
    def current(cls) -> DataParallel:
        """The initialised process group's rank and size, or a single process."""
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    @property
    def main(self) -> bool:
        """Rank 0: the one process that writes the run folder."""
        return self.rank == 0

    def block(self, n: int) -> range:
        """This rank's contiguous share of ``n`` items (sizes differ by at most one)."""
        return range(self.rank * n // self.world, (self.rank + 1) * n // self.world)

    def share(self, items: Sequence[T]) -> list[T]:
        return [items[i] for i in self.block(len(items))]

    def all_reduce_grads(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Sum the gradients of ``params`` over the ranks, in place (a rank with no rows contributes zeros)."""
        if self.world == 1 or not params:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad = g.view_as(p)

    def combine_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Per-rank shares of a weighted metric summed over the ranks (``*_max_dev`` keys: the maximum)."""
        if self.world == 1:
            return metrics
        out: dict[str, float] = {}
        for part in self.gather(metrics):
            for key, v in part.items():
                out[key] = max(out.get(key, v), v) if key.endswith("_max_dev") else out.get(key, 0.0) + v
        return out

    def sum_counts(self, counts: dict[str, int]) -> dict[str, int]:
        """Counters summed over the ranks (every rank gets the total)."""
        parts = self.gather(counts)
        return {key: sum(p.get(key, 0) for p in parts) for key in parts[0]}

    def from_main(self, value: T) -> T:
        """Rank 0's ``value`` on every rank (a decision all ranks must take together, e.g. a time budget)."""
        return self.gather(value)[0]

    def gather(self, obj: T) -> list[T]:
        """``obj`` of every rank, in rank order (pickled; for rows and metrics, not tensors)."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=object_group())
        return out


def object_group():
    """The group of object collectives: the default group when its backend is gloo alone, else the gloo group
    :func:`init_group` made beside it (``None`` means the default group)."""
    return _OBJECT_GROUP[0] if _OBJECT_GROUP else None


def init_group(device: str | torch.device, **kwargs: Any) -> str:
    """``init_process_group`` with the backend of ``device`` (:func:`slea.device.backend_for`), after
    ``set_device`` on a GPU; a GPU group also gets a gloo group for object collectives. Returns the backend."""
    from slea.device import backend_for

    device = torch.device(device)
    backend = backend_for(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT, **kwargs)
    _OBJECT_GROUP.clear()
    if backend != "gloo":
        _OBJECT_GROUP.append(dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT))
    return backend


def rank_device(spec: str) -> torch.device:
    """The device of this process in a data-parallel run (``run.device``: auto, cpu, cuda; ``cuda:N`` is refused
    with several processes), from ``LOCAL_RANK`` and ``WORLD_SIZE`` (slea/device.py)."""
    from slea.device import run_device

    return run_device(spec)


def launch(fn: Callable[..., Any], nproc: int, *args: Any, device: str = "cpu") -> None:
    """Run ``fn(*args)`` in ``nproc`` spawned processes joined in one group on this machine (ranks
    0..nproc-1, ``LOCAL_RANK`` = rank, ``WORLD_SIZE`` = nproc in each); returns when all have finished, and
    raises when one failed. ``device``: the ``run.device`` of the ranks (``cpu``: a gloo group; ``cuda``/
    ``auto`` on a GPU node: rank r on ``cuda:r``, NCCL). ``fn`` must be importable by name (spawned processes
    unpickle it).

    This process hosts the group's rendezvous store on a port the OS assigns as it listens, so no other job on
    the machine can take the port between its choice and its use (a port probed free and bound later can be,
    and ranks of two jobs that meet at one store exchange each other's collectives); and the store outlives
    every rank, so no rank's teardown meets a vanished store."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=COLLECTIVE_TIMEOUT)
    torch.multiprocessing.spawn(_rank_main, args=(fn, nproc, store.port, args, device), nprocs=nproc, join=True)


def _rank_main(rank: int, fn: Callable[..., Any], world: int, port: int, args: tuple, device: str = "cpu") -> None:
    faulthandler.enable()  # a native abort in a rank prints its Python stacks, not a bare "SIGABRT"
    os.environ.update(LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE=str(world))
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=COLLECTIVE_TIMEOUT)
    init_group(rank_device(device), store=store, rank=rank, world_size=world)
    try:
        fn(*args)
        dist.barrier()  # no rank tears its group down while another still has a collective in flight
    finally:
        dist.destroy_process_group()


def is_torchrun() -> bool:
    """Whether torchrun started this process as one of several (``WORLD_SIZE`` > 1 in the environment)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_from_torchrun(device: str = "cpu") -> bool:
    """Join the group torchrun describes (``WORLD_SIZE``/``RANK``/``LOCAL_RANK``/``MASTER_ADDR`` in the
    environment) when this process was started by it and no group exists yet, on this rank's device of
    ``run.device`` (``device``); True when a multi-process group is now initialised."""
    if not is_torchrun():
        return False
    if not dist.is_initialized():
        init_group(rank_device(device))
    return True


def device_mesh(model):
    """The one-dimensional mesh of every rank on the device type ``model`` lives on (FSDP2's ``mesh``)."""
    from torch.distributed.device_mesh import init_device_mesh

    from slea.device import model_device

    return init_device_mesh(model_device(model).type, (dist.get_world_size(),))


def shard_frozen_base(model) -> None:
    """Shard ``model``'s frozen weights over the process group with FSDP2 (module docstring): every decoder
    layer is one FSDP unit, the root (embeddings, final norm, LM head) another; the trainable (LoRA) parameters
    stay replicated. A model whose trainable parameters are more than adapters is refused by the config check
    (``train.fsdp`` needs ``model.lora``)."""
    from torch.distributed.fsdp import fully_shard

    trainable = {p for p in model.parameters() if p.requires_grad}
    mesh = device_mesh(model)  # shards stay on the model's device (CPU in a gloo group, cuda:LOCAL_RANK on GPUs)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, ignored_params=trainable)
    fully_shard(model, mesh=mesh, ignored_params=trainable)


def decoder_layers(model) -> list[torch.nn.Module]:
    """The decoder layers of an HF causal LM (peft-wrapped or not): the modules of its ``ModuleList`` of
    blocks, found as the list whose length is ``config.num_hidden_layers``."""
    n = model.config.num_hidden_layers
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n:
            return list(module)
    raise ValueError(f"no list of {n} decoder layers in {type(model).__name__}")


def is_sharded(model) -> bool:
    """Whether ``model`` holds FSDP-sharded modules (:func:`shard_frozen_base`)."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


@contextlib.contextmanager
def full_weights(model) -> Iterator[None]:
    """Inside: every FSDP unit of ``model`` holds its whole weights (one all-gather per unit on entry, so every
    rank must enter together) and keeps them across forwards, so forwards issue no collective and the ranks may
    run different numbers of them (generation). On exit the units drop back to their shards. A model that is
    not sharded passes through. The price is memory: the whole base model per rank while inside."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.set_reshard_after_forward(False)
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(True)


def lockstep_passes(n_rows: int, world: int, micro_batch: int) -> int:
    """The micro-batches the busiest rank runs on ``n_rows`` rows shared by :meth:`DataParallel.block` (its
    share is ``ceil(n_rows / world)`` rows): under sharding every rank runs this many passes."""
    return math.ceil(math.ceil(n_rows / world) / micro_batch)
