"""``slea train``'s steps, each a function the command calls in turn: its config (a new run's, or a resumed run's
own), the checks every run passes before any model loads (:func:`preflight`: the trainer's own checks, the
devices, the model names, what the processes can train, a fresh run folder), then training in this process, in
``--nproc`` spawned ranks, or as one rank of torchrun's group. A refusal is one line and exit code 2; a run halted
by a reliability guard, exit code 3."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from slea.cli.common import console, err, fail, plain, run_config
from slea.cli.play import _model_target
from slea.cli.runs import finished, fit_with_signals, summary_table
from slea.runs.folder import RunFolder

if TYPE_CHECKING:
    from slea.config import ModelSection


@dataclass(frozen=True)
class Launch:
    """Where and how a run trains, chosen once before any model loads."""

    run_dir: Path  # chosen once: a timestamped name must not change between the checks and the trainer
    nproc: int  # data-parallel processes this command starts (1: this process, or torchrun's rank)
    created: bool  # the folder does not exist yet: removed again if no training starts in it


def train_config(config: Path | None, set_: list[str], resume: Path | None, overwrite: bool):
    """The config ``slea train`` trains: ``config`` with ``--set``, or the resumed run's own config.yaml; None
    when the resumed run is finished (said; a larger train.iterations or budget extends it instead)."""
    if resume is not None and overwrite:
        raise fail("train: --resume continues the run in its folder and --overwrite deletes it: give one of them")
    if resume is None:
        return run_config(config, set_)
    if not RunFolder(resume).is_run():
        raise fail(f"--resume: {resume} has no config.yaml (not a run folder)")
    cfg = run_config(RunFolder(resume).config, list(set_) + [f"run.dir={resume}"], saved=True)
    return None if finished(resume, list(set_)) else cfg


def preflight(cfg, *, resume: Path | None, overwrite: bool, nproc: int | None) -> Launch:
    """The checks before any model loads, in order (a :class:`slea.config.ConfigError` is ``config error: ...``,
    a run folder that may not be written ``train: ...``; one line, exit code 2): the trainer chosen by what the
    algorithm needs and its own checks (slea/trainer/select.py); ``run.device`` on every process; the model
    names are here (offline: nothing is downloaded); what the processes can train; a new run's folder is free,
    or cleared with ``--overwrite``. ``nproc`` None: 1, or a resumed run's own count."""
    from slea.config import ConfigError
    from slea.trainer.lifecycle import RunDirError, fresh_run_dir

    try:
        nproc, run_dir = _checked(cfg, resume, nproc)
    except ConfigError as exc:
        raise fail(f"config error: {exc}") from None
    if resume is None and int(os.environ.get("RANK", "0")) == 0:  # a new run (under torchrun: its rank 0 checks)
        try:  # never two runs in one folder: refused, or cleared with --overwrite, after every check above
            fresh_run_dir(run_dir, overwrite)
        except RunDirError as exc:
            raise fail(f"train: {exc}") from None
    return Launch(run_dir, nproc, created=not run_dir.exists())


def _checked(cfg, resume: Path | None, nproc: int | None) -> tuple[int, Path]:
    """:func:`preflight`'s config checks: ``(processes, run folder)``, or a :class:`slea.config.ConfigError`."""
    from slea.config import ConfigError
    from slea.parallel.checks import check_data_parallel, check_rank_devices
    from slea.parallel.distributed import DataParallel, is_torchrun
    from slea.runs.checkpoint import trained_processes
    from slea.trainer.lifecycle import run_dir_for
    from slea.trainer.select import check_config

    check_config(cfg)  # the trainer is chosen by what the algorithm declares it needs, and its own checks run
    run_dir = run_dir_for(cfg)
    if nproc is None:  # a resumed --nproc run (train.fsdp needs it) restarts with its own count; torchrun sets its own
        nproc = trained_processes(resume) if resume is not None and not is_torchrun() else 1
    # run.device names a device this machine has, for every process: before any model loads
    check_rank_devices(cfg.run.device, nproc if nproc > 1 else int(os.environ.get("WORLD_SIZE", "1")))
    for key, name in (("model.name_or_path", cfg.model.name_or_path), ("model.tokenizer", cfg.model.tokenizer)):
        if name is not None and not _model_target(name):  # offline: a name that is not here is never downloaded
            raise ConfigError(f"{key}: {name!r} is neither 'embedded', 'tiny', a model folder (with config.json) "
                              f"nor a model in the local Hugging Face cache (nothing is downloaded)")
    if not is_torchrun():  # what these processes can train (a torchrun rank checks its group once it joins it)
        check_data_parallel(cfg, DataParallel(0, nproc))
    return nproc, run_dir


def train_here(cfg, launch: Launch, resume: bool) -> None:
    """Train in this process: the single-agent RL trainer or the team trainer (slea/trainer/select.py), Ctrl-C
    and SIGTERM finishing the step in progress (slea/cli/runs.py), then the summary table. A trainer that cannot
    be built leaves no folder it made behind."""
    from slea.config import ConfigError
    from slea.policy.openai_engine import GeneratorError
    from slea.trainer.guards import RunHalted
    from slea.trainer.select import build_trainer

    try:
        trainer = build_trainer(cfg, launch.run_dir)  # the single-agent RL trainer, or the team trainer (TeamTR)
    except ConfigError as exc:  # a value the trainer cannot use, one checkable only against the model, a model
        _discard(launch)  # that does not load, an env that cannot be built
        raise fail(f"config error: {exc}") from None
    except GeneratorError as exc:  # a managed vLLM server that did not start: its log's tail, one line
        _discard(launch)
        raise fail(str(exc)) from None
    except KeyboardInterrupt:
        _discard(launch)
        raise fail("Ctrl-C: stopped while the model loaded; nothing was trained", 130) from None
    plain(f"run folder: {trainer.dir}")
    try:  # Ctrl-C / SIGTERM: the step in progress is finished and checkpointed, then the resume command
        summary = fit_with_signals(trainer, resume)
    except RunHalted as exc:  # a reliability guard (NaN streak, env fault rate): one clear line, exit 3
        raise fail(f"run halted: {exc}", 3) from None
    finally:
        trainer.close()  # a managed vLLM server stops, also on an error or Ctrl-C
    console.print(summary_table(summary))


def train_torchrun_rank(cfg, launch: Launch, resume: bool) -> bool:
    """Train as one rank of torchrun's group when torchrun started this process (``torchrun --nproc-per-node N -m
    slea.cli train ...``): True once it has; False when it did not start this process."""
    from slea.config import ConfigError
    from slea.parallel.checks import check_data_parallel
    from slea.parallel.distributed import DataParallel, init_from_torchrun, is_torchrun

    if is_torchrun():
        _build_cached_model(cfg.model)  # before this process joins the group (see the function)
    if not init_from_torchrun(cfg.run.device):
        return False
    dp = DataParallel.current()
    try:
        check_data_parallel(cfg, dp)
    except ConfigError as exc:
        raise fail(f"config error: {exc}") from None
    try:
        _train_rank(cfg, dp.from_main(launch.run_dir), resume)
    finally:
        import torch.distributed as dist

        dist.destroy_process_group()
    return True


def train_data_parallel(cfg, launch: Launch, resume: bool) -> None:
    """``slea train --nproc N``: N spawned ranks in one group (slea/parallel/distributed.py; gloo on CPU, NCCL
    with one GPU per rank). (Under ``torchrun --nproc-per-node N -m slea.cli train ...`` each process joins
    torchrun's group instead: :func:`train_torchrun_rank`.)"""
    import torch.multiprocessing as mp

    from slea.parallel.distributed import launch as spawn

    _build_cached_model(cfg.model)  # once, here: a spawned rank > 0 could not write it
    plain(f"run folder: {launch.run_dir}  ({launch.nproc} data-parallel processes)")
    try:
        spawn(_train_rank, launch.nproc, cfg, launch.run_dir, resume, device=cfg.run.device)
    except mp.ProcessExitedException as exc:  # a rank exited 2 or 3 after printing its one line
        if exc.exit_code == 2:
            _discard(launch)
        raise typer.Exit(exc.exit_code if exc.exit_code in (2, 3) else 1) from None


def _discard(launch: Launch) -> None:
    """Remove the run folder this command created when no training started in it (the trainer could not be built):
    no empty or half-made folder is left behind."""
    import shutil

    if launch.created and not RunFolder(launch.run_dir).config.exists():
        shutil.rmtree(launch.run_dir, ignore_errors=True)


def _build_cached_model(model_cfg: ModelSection) -> None:
    """Build the cached ``tiny`` / ``embedded`` model folders a run names, in this process before it joins a
    process group: in a rank > 0 of one, transformers' ``save_pretrained`` writes nothing."""
    from slea.policy.model import resolve

    for name in {model_cfg.name_or_path, model_cfg.tokenizer or model_cfg.name_or_path}:
        resolve(name)


def _train_rank(cfg, run_dir: Path, resume: bool) -> None:
    """One rank of ``slea train --nproc``: rank 0 logs, writes the run folder and prints the summary."""
    from slea.config import ConfigError
    from slea.parallel.distributed import DataParallel
    from slea.plugins import import_plugin
    from slea.progress import setup_logging
    from slea.trainer.guards import RunHalted
    from slea.trainer.rl import Trainer

    main = DataParallel.current().main
    setup_logging(logging.INFO if main else logging.WARNING)  # one rank reports progress
    for module in cfg.plugins:  # a spawned rank received the config, not the parent's imports: register them here
        import_plugin(module)
    try:
        trainer = Trainer(cfg, run_dir=run_dir)
    except ConfigError as exc:
        fail(f"config error: {exc}")  # the line (and under --debug the traceback); this rank's exit code below
        sys.exit(2)
    try:
        summary = trainer.fit(resume=resume)
    except RunHalted as exc:
        if main:
            err.print(f"run halted: {exc}", markup=False, highlight=False)
        sys.exit(3)
    if main:
        console.print(summary_table(summary))
