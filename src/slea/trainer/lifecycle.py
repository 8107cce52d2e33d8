"""One run lifecycle, the part both trainers share (the single-agent :class:`slea.trainer.rl.Trainer` and the team's
:class:`slea.trainer.team.TeamTrainer`); each adds only what is its own.

:func:`fit` is the whole run, one path for both::

    config.yaml → resume point → evaluation before → for each step: the trainer's step, its row logged,
    checkpoint when due → evaluation after → curves and eval/summary.json

A *step* is the unit a trainer checkpoints and logs one ``metrics.jsonl`` row for: an iteration of the single-agent
trainer, a single-agent update of the team's (:class:`Run` lists what a trainer gives the skeleton). The pieces:

* the save guard (:func:`check_saveable`): weights that hold NaN/inf are never checkpointed, the run stops
  (:class:`slea.trainer.guards.RunHalted`) naming the last good checkpoint;
* resume (:func:`load_resume_point`): the newest intact checkpoint is loaded, the rows logged after it dropped (those
  steps are redone); none at all starts the run over, only damaged ones refuse and change nothing;
  :func:`announce_resume` says where the run stands, in the numbering every log line uses (from 1);
* the run folder (:func:`run_dir_for`, unless the caller names one; a new run never writes into one that holds
  another run, :func:`fresh_run_dir`, unless told to clear it, :func:`clear_run_dir`) and the seeds of python, numpy and torch
  (:func:`seed_everything`);
* the run folder's ``config.yaml``, written first (:func:`write_config`);
* the held-out evaluation before training (:func:`evaluation_before`: run once, read back on resume) and after it,
  their log lines (:func:`eval_line`) and their marks on ``curves.png`` (:func:`held_out_marks`);
* the training steps (:func:`train`, one step :func:`train_step`): a budget (the trainer's :meth:`Run.budget_stop`)
  stops the run before a step, a signal (:class:`slea.trainer.interrupt.StopSignal`) after one, which is then
  checkpointed; a run stopped between checkpoints checkpoints its last step;
* the run's wall time over all its processes (:class:`WallClock`: a checkpoint keeps it, a resume restores it; it
  also times the training steps, which the time budget counts) and ``eval/summary.json``, written last so its
  presence marks a finished run (:func:`write_summary`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from slea.atomic import atomic_write_text
from slea.config import ConfigError, RunConfig, dump_config
from slea.evaluation.evaluate import write_eval
from slea.runs import checkpoint as ckpt
from slea.runs.folder import MARKERS, SUMMARY, RunFolder
from slea.runs.jsonfile import Evaluation, RunFileError, read_json
from slea.runs.runlog import RunLog, truncate_metrics
from slea.trainer.guards import RunHalted
from slea.trainer.interrupt import Interrupted, StopSignal

log = logging.getLogger(__name__)


def run_dir_for(cfg: RunConfig) -> Path:
    """The run folder: ``run.dir``, else ``runs/<run.name>``, else ``runs/<date-time>``."""
    if cfg.run.dir:
        return Path(cfg.run.dir)
    name = cfg.run.name or datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / name


class RunDirError(ValueError):
    """A run folder a new run may not write into (it holds another run), or that ``--overwrite`` may not clear."""


RUN_MARKERS = MARKERS  # a folder holding one of them is a run folder --overwrite may clear (slea/runs/folder.py)


def fresh_run_dir(run_dir: str | Path, overwrite: bool = False) -> None:
    """Ready ``run_dir`` for a new run (not a resumed one). A folder that does not exist yet, or holds nothing, is
    used as it is. One that holds anything is refused (:class:`RunDirError`: a second run's metrics rows,
    TensorBoard events, checkpoints and evaluations would mix with the first's), unless ``overwrite``: then it is
    cleared first (:func:`clear_run_dir`)."""
    path = Path(run_dir)
    if not path.exists() and not path.is_symlink():
        return
    if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
        return
    if not overwrite:
        raise RunDirError(f"{path} already holds a run; continue it with `slea train --resume {path}`, or start "
                          f"over with --overwrite (which deletes what the folder holds)")
    clear_run_dir(path)


def clear_run_dir(run_dir: str | Path) -> None:
    """Delete a run folder, safely: only a real folder (not a link) that holds what a slea run writes
    (:data:`RUN_MARKERS`), no git checkout, and neither the working folder, one above it, nor the home folder;
    anything else is a :class:`RunDirError` and nothing is deleted. The folder is first renamed to a hidden
    sibling and then removed, so an interrupted clear never leaves half a run under the run's name."""
    path = Path(run_dir)
    if path.is_symlink():
        raise RunDirError(f"--overwrite: {path} is a link; remove or replace it yourself (nothing was deleted)")
    if not path.is_dir():
        raise RunDirError(f"--overwrite: {path} is not a folder (nothing was deleted)")
    real, cwd = path.resolve(), Path.cwd().resolve()
    if real == cwd or real in cwd.parents or real == Path.home().resolve():
        raise RunDirError(f"--overwrite: {path} holds the working folder or the home folder; not deleting it")
    if (path / ".git").exists() or not any((path / m).exists() for m in RUN_MARKERS):
        raise RunDirError(f"--overwrite: {path} does not look like a slea run folder (none of "
                          f"{', '.join(RUN_MARKERS)}); not deleting it")
    aside = path.with_name(f".{path.name}.overwritten-{os.getpid()}")
    shutil.rmtree(aside, ignore_errors=True)
    path.rename(aside)
    shutil.rmtree(aside)


@contextlib.contextmanager
def building(what: str, catch: tuple[type[BaseException], ...] = (Exception,)) -> Iterator[None]:
    """Building a run's model or envs: an exception of ``catch`` raised inside becomes one
    :class:`slea.config.ConfigError` line, ``what`` then the exception's type and the first line of its message
    (transformers' ``OSError`` for a model folder it cannot load, an env constructor's error such as a tool
    function without an ``Args:`` line); the exception stays its cause, which ``slea --debug`` prints. A
    ``ConfigError`` passes as it is."""
    try:
        yield
    except ConfigError:
        raise
    except catch as exc:
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        raise ConfigError(f"{what}: {type(exc).__name__}" + (f": {first[:300]}" if first else "")) from exc


def seed_everything(seed: int) -> None:
    """Seed python's, numpy's and torch's global generators (a run's start; env seeds are separate)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def write_config(run_dir: Path, cfg: RunConfig) -> None:
    """``<run>/config.yaml``, the resolved config, written atomically before anything else (a kill must not cost
    the config: ``--resume`` reads it)."""
    atomic_write_text(RunFolder(run_dir).config, dump_config(cfg))


class WallClock:
    """A run's wall seconds over all its processes: those of the earlier ones up to their last checkpoint
    (:attr:`before`, restored on resume) plus this process's since its fit began (:meth:`restart`); and this
    process's seconds of training steps (:meth:`training_seconds`, since :meth:`start_training`: the evaluations
    before training are not counted)."""

    def __init__(self) -> None:
        self.before = 0.0
        self.start = self.train_start = time.perf_counter()

    def restart(self) -> None:
        self.start = time.perf_counter()

    def seconds(self) -> float:
        return self.before + time.perf_counter() - self.start

    def start_training(self) -> None:
        self.train_start = time.perf_counter()

    def training_seconds(self) -> float:
        return time.perf_counter() - self.train_start


def check_saveable(weights: Iterable[torch.Tensor], where: str, last_checkpoint: str | None) -> None:
    """:class:`RunHalted` when a tensor of ``weights`` (what a checkpoint would hold) is not finite: no checkpoint
    of them is written, and the message names ``where`` the run stopped and the last good checkpoint."""
    if not all(bool(torch.isfinite(p).all()) for p in weights):
        raise RunHalted(f"stopped at {where}: the weights hold NaN/inf, so no checkpoint was written; the last good "
                        f"checkpoint is {last_checkpoint}")


def load_resume_point(root: Path, weights, optimizer, run_log: RunLog) -> tuple[Path | None, dict[str, Any] | None, int]:
    """Load the newest intact checkpoint under ``root`` into ``weights`` and ``optimizer``
    (:func:`slea.runs.checkpoint.load_latest`: damaged ones are skipped with a warning) and drop what
    ``run_log`` holds after it. Returns its folder, its state and its step (``-1`` and ``None``s when there is no
    checkpoint: the run starts over); :class:`RunHalted` when checkpoints exist but none loads (nothing is changed)."""
    last, state = ckpt.load_latest(root, weights, optimizer)
    if state is None and ckpt.list_checkpoints(root):  # never wipe a run over it
        raise RunHalted(f"--resume: no checkpoint in {root} loads (see the warnings); nothing was changed. "
                        f"Move that folder away to start the run over.")
    step = int(state["iteration"]) if state is not None else -1
    truncate_metrics(run_log.path, step)
    run_log.purge_after(step)
    return last, state, step


def announce_resume(log: logging.Logger, done: str, checkpoint: str, following: str | None, finished: str) -> None:
    """The resumed run's log line: after ``done`` (from ``checkpoints/<checkpoint>``), continuing with ``following``,
    or, when nothing is left to train (``None``), ``finished``: the held-out evaluation follows."""
    nxt = f"continuing with {following}" if following is not None else f"{finished}: the held-out evaluation follows"
    log.info("resumed after %s (checkpoints/%s); %s", done, checkpoint, nxt)


def evaluation_before(cfg: RunConfig, run_dir: Path, fresh: bool, evaluate: Callable[[], dict | None],
                      stop: StopSignal) -> dict | None:
    """The held-out evaluation before training (``eval.before``; ``None`` when it is off): ``evaluate()`` when
    nothing is trained yet (``fresh``; it returns ``None`` on a rank that does not evaluate), else the one a resumed
    run already wrote (``eval/before.json``, ``None`` when there is none)."""
    if not cfg.eval.before:
        return None
    if fresh:
        stop.doing = "the held-out evaluation before training"
        before = evaluate()
        if before is not None:
            log.info(eval_line("untrained", before))
        return before
    path = RunFolder(run_dir).evaluation("before")
    if not path.is_file():
        return None
    try:
        return read_json(path, Evaluation)
    except RunFileError as exc:  # damaged: the run goes on without it (the summary then has no "before")
        log.warning("eval/%s; the evaluation before training is left out", exc)
        return None


def held_out_marks(before: dict | None, after: dict) -> dict[str, float]:
    """The held-out sampled success rates before (when evaluated) and after training, as ``curves.png`` marks
    them."""
    marks = {"held-out before (sampled)": before["sampled"]["success"]} if before is not None else {}
    return {**marks, "held-out after (sampled)": after["sampled"]["success"]}


def write_summary(run_dir: Path, own: dict[str, Any], *, before: dict | None, after: dict, clock: WallClock,
                  checkpoint: str | None, precision: dict[str, str], device) -> dict[str, Any]:
    """``<run>/eval/summary.json``: the run folder, the trainer's ``own`` fields, both evaluations, the wall seconds
    (earlier processes included), the last checkpoint, the precision and the device; written last."""
    summary = {"run_dir": str(run_dir), **own, "before": before, "after": after, "wall_s": clock.seconds(),
               "checkpoint": checkpoint, "precision": precision, "device": str(device)}
    write_eval(Path(run_dir), SUMMARY, summary)
    return summary


def eval_line(label: str, res: dict) -> str:
    """A held-out evaluation's log line (``label``: untrained, trained)."""
    s = res["sampled"]
    g = res.get("greedy")
    greedy = f", greedy {g['success']:.2f}" if g else ""
    return (f"held-out ({label}): sampled success {s['success']:.2f} (invalid {s['invalid_rate']:.2f})"
            f"{greedy}  [{res['wall_s']:.0f}s]")


class Run(Protocol):
    """What a trainer gives :func:`fit`. Steps are indexed from 0 (``metrics.jsonl`` rows and ``state.json`` keep
    that index); log lines, checkpoint folders and the report's charts count them from 1."""

    cfg: RunConfig
    dir: Path  # the run folder
    device: Any
    log: RunLog  # metrics.jsonl (and TensorBoard, W&B, MLflow)
    clock: WallClock
    stop: StopSignal
    last_checkpoint: str | None
    main: bool  # whether this process writes the run folder (data-parallel: rank 0 alone)
    first_step: int  # the step training starts from: 0, or the one after a resumed checkpoint
    total_steps: int
    unit: str  # what a step is, in the plural, for the log ("iterations")

    def resume(self) -> bool:
        """Load the newest intact checkpoint and set :attr:`first_step` (``False``: none, the run starts over)."""

    def begin(self) -> None:
        """Anything the trainer readies once it knows where training starts (before the evaluation)."""

    def evaluate_before(self) -> dict | None:
        """The held-out evaluation of the untrained policy (``None`` on a process that does not evaluate)."""

    def budget_stop(self) -> str:
        """Which budget forbids starting the next step ('' when none does)."""

    def step_name(self, k: int) -> str:
        """Step ``k`` as the log lines name it (``iteration 3/10``)."""

    def step(self, k: int) -> dict[str, Any]:
        """Train step ``k``; its metrics row."""

    def report(self, k: int, row: dict[str, Any]) -> None:
        """Step ``k``'s progress line; the trainer's guards may stop the run here, before its checkpoint."""

    def save(self, k: int) -> None:
        """Checkpoint step ``k`` (never weights that hold NaN/inf: :func:`check_saveable`)."""

    def interrupted(self, k: int) -> Interrupted:
        """The stop a signal asked for, after step ``k`` (-1: before any step)."""

    def evaluate_after(self) -> dict | None:
        """The held-out evaluation of the trained policy (``None`` on a process that does not evaluate)."""

    def close_rank(self) -> dict[str, Any]:
        """The end of a process that does not evaluate (its result instead of the summary)."""

    def finish(self, before: dict | None, after: dict) -> tuple[dict[str, Any], dict[str, str]]:
        """Draw ``curves.png`` and close what the run opened; the summary's own fields and its precision."""

    def release(self) -> None:
        """Close what the run opened (loggers, env pools, the library) when it stops on a signal."""


def fit(run: Run, resume: bool = False) -> dict[str, Any]:
    """A whole run: ``config.yaml`` → the resume point → the evaluation before training → the training steps
    (:func:`train`) → the evaluation after → ``curves.png`` and ``eval/summary.json`` (its fields: the trainer's
    own, then both evaluations, the wall seconds, the last checkpoint, the precision and the device). A stop asked
    by a signal raises :class:`Interrupted` after what is written is flushed (:meth:`Run.release`)."""
    if run.main:
        write_config(run.dir, run.cfg)
    if resume:
        run.resume()
    run.begin()
    run.clock.restart()
    try:
        before = evaluation_before(run.cfg, run.dir, run.first_step == 0, run.evaluate_before, run.stop)
        train(run)
        run.stop.doing = "the held-out evaluation after training"
        after = run.evaluate_after()
    except (Interrupted, KeyboardInterrupt):  # what is written stays; the loggers flush, the envs close
        run.release()
        raise
    if after is None:
        return run.close_rank()
    log.info(eval_line("trained", after))
    own, precision = run.finish(before, after)
    return write_summary(run.dir, own, before=before, after=after, clock=run.clock,
                         checkpoint=run.last_checkpoint, precision=precision, device=run.device)


def train(run: Run) -> None:
    """The training steps from :attr:`Run.first_step` to :attr:`Run.total_steps`, each :func:`train_step`, until a
    budget forbids the next one (:meth:`Run.budget_stop`) or a signal asks to stop (:class:`Interrupted`, before the
    first step or after the one in progress, which is checkpointed). A run stopped by a budget between checkpoints
    checkpoints its last step, so the weights evaluated after training are saved too."""
    run.clock.start_training()  # the time budget covers training steps, not the evaluations
    done = saved = run.first_step - 1  # the last step trained, and the last checkpointed
    if run.stop.requested:  # asked during the evaluation before training
        raise run.interrupted(done)
    for k in range(run.first_step, run.total_steps):
        stopped_by = run.budget_stop()
        if stopped_by:
            log.info("%s reached after %d %s", stopped_by, k, run.unit)
            break
        train_step(run, k)
        done = k
        if checkpoint_due(run.cfg, k, run.total_steps):
            saved = k
    if done > saved:
        run.save(done)


def train_step(run: Run, k: int) -> dict[str, Any]:
    """Step ``k``: the trainer's step, its row logged and reported, a checkpoint when due (or when a signal asked
    to stop: then :class:`Interrupted` follows it). Returns the row."""
    run.stop.doing = run.step_name(k)
    row = run.step(k)
    run.log.log(k, row)
    run.report(k, row)
    if checkpoint_due(run.cfg, k, run.total_steps) or run.stop.requested:
        run.save(k)
    if run.stop.requested:
        run.stop.doing = ""  # the step is checkpointed: a second signal from here abandons nothing of it
        raise run.interrupted(k)
    return row


def checkpoint_due(cfg: RunConfig, k: int, total: int) -> bool:
    """Whether step ``k`` is checkpointed: every ``train.save_every`` steps and the run's last."""
    return (k + 1) % cfg.train.save_every == 0 or k == total - 1
