"""One run lifecycle, the part both trainers share (the single-agent :class:`slea.trainer.rl.Trainer` and the team's
:class:`slea.trainer.team.TeamTrainer`); each adds only what is its own.

:func:`fit` is the whole run, one path for both::

    config.yaml → resume point → evaluation before → for each step: the trainer's step, its row logged, the
    guards, checkpoint when due → evaluation after → curves and eval/summary.json

A *step* is the unit a trainer checkpoints and logs one ``metrics.jsonl`` row for: an iteration of the single-agent
trainer, a single-agent update of the team's. A trainer gives the skeleton its :class:`RunState`
(slea/trainer/run_state.py: the run folder and log, the clock, the counters, the stop signal, the budgets and the
guards) and the six methods of :class:`Run`: ``start``, ``step``, ``save``, ``evaluate``, ``summary``, and ``close``,
its one teardown. The pieces:

* the save guard (:func:`check_saveable`): weights that hold NaN/inf are never checkpointed, the run stops
  (:class:`slea.trainer.guards.RunHalted`) naming the last good checkpoint;
* resume (:func:`start`, the trainer's loading through :func:`load_resume_point`): the newest intact checkpoint is
  loaded, the rows logged after it dropped (those steps are redone), the run's state restored from its
  ``state.json``; none at all starts the run over, only damaged ones refuse and change nothing;
  :func:`announce_resume` says where the run stands, in the numbering every log line uses (from 1);
* checkpoints (:func:`save`): the trainer writes its weights and own keys, the run's state adds its own;
* the run folder (:func:`run_dir_for`, unless the caller names one; a new run never writes into one that holds
  another run, :func:`fresh_run_dir`, unless told to clear it, :func:`clear_run_dir`) and the seeds of python, numpy and torch
  (:func:`seed_everything`);
* the run folder's ``config.yaml``, written first (:func:`write_config`);
* the held-out evaluation before training (:func:`evaluation_before`: run once, read back on resume) and after it,
  their log lines (:func:`eval_line`) and their marks on ``curves.png`` (:func:`held_out_marks`);
* the training steps (:func:`train`, one step :func:`train_step`): a budget (:meth:`RunState.budget_stop`) stops
  the run before a step, a guard (:meth:`RunState.check_guards`) after its row is logged, a signal
  (:class:`slea.trainer.interrupt.StopSignal`) after the step, which is then checkpointed; a run stopped by a budget
  between checkpoints checkpoints its last step;
* ``eval/summary.json``, written last so its presence marks a finished run (:func:`write_summary`), with the run's
  wall time over all its processes (:class:`WallClock`).
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
from typing import Any, Protocol, cast

import numpy as np
import torch

from slea.atomic import atomic_write_text
from slea.config import ConfigError, RunConfig, dump_config
from slea.evaluation.evaluate import write_eval
from slea.runs import checkpoint as ckpt
from slea.runs.folder import MARKERS, SUMMARY, RunFolder
from slea.runs.jsonfile import Evaluation, RunFileError, read_json
from slea.runs.runlog import RunLog, plot_curves, truncate_metrics
from slea.trainer.guards import RunHalted
from slea.trainer.interrupt import Interrupted, StopSignal
from slea.trainer.run_state import RunState, WallClock

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


def check_saveable(weights: Iterable[torch.Tensor], where: str, last_checkpoint: str | None) -> None:
    """:class:`RunHalted` when a tensor of ``weights`` (what a checkpoint would hold) is not finite: no checkpoint
    of them is written, and the message names ``where`` the run stopped and the last good checkpoint."""
    if not all(bool(torch.isfinite(p).all()) for p in weights):
        raise RunHalted(f"stopped at {where}: the weights hold NaN/inf, so no checkpoint was written; the last good "
                        f"checkpoint is {last_checkpoint}")


def load_resume_point(root: Path, weights: ckpt.Weights, optimizer: ckpt.OptimizerState,
                      run_log: RunLog) -> tuple[Path | None, dict[str, Any] | None, int]:
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


def evaluation_before(cfg: RunConfig, run_dir: Path, fresh: bool, evaluate: Callable[[], dict[str, Any] | None],
                      stop: StopSignal) -> dict[str, Any] | None:
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
        evaluation: dict[str, Any] = read_json(path, Evaluation)  # the schema checked it is an object
        return evaluation
    except RunFileError as exc:  # damaged: the run goes on without it (the summary then has no "before")
        log.warning("eval/%s; the evaluation before training is left out", exc)
        return None


def held_out_marks(before: dict[str, Any] | None, after: dict[str, Any]) -> dict[str, float]:
    """The held-out sampled success rates before (when evaluated) and after training, as ``curves.png`` marks
    them."""
    marks = {"held-out before (sampled)": before["sampled"]["success"]} if before is not None else {}
    return {**marks, "held-out after (sampled)": after["sampled"]["success"]}


def write_summary(run_dir: Path, own: dict[str, Any], *, before: dict[str, Any] | None, after: dict[str, Any],
                  clock: WallClock, checkpoint: str | None) -> dict[str, Any]:
    """``<run>/eval/summary.json``: the run folder, the trainer's ``own`` fields, both evaluations, the wall seconds
    (earlier processes included), the last checkpoint, then ``own``'s precision and device; written last."""
    own = dict(own)
    precision, device = own.pop("precision"), own.pop("device")
    summary = {"run_dir": str(run_dir), **own, "before": before, "after": after, "wall_s": clock.seconds(),
               "checkpoint": checkpoint, "precision": precision, "device": str(device)}
    write_eval(Path(run_dir), SUMMARY, summary)
    return summary


def eval_line(label: str, res: dict[str, Any]) -> str:
    """A held-out evaluation's log line (``label``: untrained, trained)."""
    s = res["sampled"]
    g = res.get("greedy")
    greedy = f", greedy {g['success']:.2f}" if g else ""
    return (f"held-out ({label}): sampled success {s['success']:.2f} (invalid {s['invalid_rate']:.2f})"
            f"{greedy}  [{res['wall_s']:.0f}s]")


class Run(Protocol):
    """What a trainer gives :func:`fit`: its :class:`RunState` and six methods. Steps are indexed from 0
    (``metrics.jsonl`` rows and ``state.json`` keep that index); log lines, checkpoint folders and the report's
    charts count them from 1."""

    state: RunState

    def start(self, resume: bool) -> tuple[Path | None, dict[str, Any] | None, int]:
        """Ready the trainer to train. With ``resume``: load the newest intact checkpoint (its weights and the
        trainer's own ``state.json`` keys, :func:`load_resume_point`) and return its folder, ``state.json`` and
        step; ``(None, None, -1)`` when there is none or ``resume`` is off (the run starts over)."""

    def step(self, k: int) -> dict[str, Any]:
        """Train step ``k`` and log its progress line; its metrics row. It tells :attr:`RunState.guard` whether
        the step's update was bad and :meth:`RunState.note_faults` its env faults, and counts the rollouts and
        env steps it played in :attr:`RunState.rollouts` and :attr:`RunState.env_steps`."""

    def save(self, k: int, state: dict[str, Any]) -> str:
        """Checkpoint step ``k`` with ``state`` (:meth:`RunState.to_state`) in its ``state.json`` beside the
        trainer's own keys; the checkpoint's folder name. Never weights that hold NaN/inf (:func:`check_saveable`)."""

    def evaluate(self, name: str) -> dict[str, Any] | None:
        """The held-out evaluation ``before`` or ``after`` training, written to ``eval/<name>.json`` (``None`` on a
        process that does not evaluate)."""

    def summary(self) -> dict[str, Any]:
        """``eval/summary.json``'s trainer fields, ``precision`` and ``device`` among them."""

    def close(self) -> None:
        """Close what the trainer opened (loggers, env pools, the library, the generation engine, a rank's scratch
        folder); idempotent. :func:`fit` calls it when the run ends or stops on a signal; the caller, on an error."""


def fit(run: Run, resume: bool = False) -> dict[str, Any]:
    """A whole run: ``config.yaml`` → the resume point (:func:`start`) → the evaluation before training → the
    training steps (:func:`train`) → the evaluation after → ``curves.png`` and ``eval/summary.json`` (its fields:
    the trainer's own, then both evaluations, the wall seconds, the last checkpoint, the precision and the device);
    a process that does not evaluate returns ``{"iterations": rows logged}``. A stop asked by a signal raises
    :class:`Interrupted` once ``curves.png`` is drawn and the trainer closed (what is written stays)."""
    st = run.state
    if st.main:
        write_config(st.dir, st.cfg)
    st.clock.restart()  # this process's wall time: the resume's loading included
    start(run, resume)
    try:
        before = evaluation_before(st.cfg, st.dir, st.first_step == 0, lambda: run.evaluate("before"), st.stop)
        train(run)
        st.stop.doing = "the held-out evaluation after training"
        after = run.evaluate("after")
    except Interrupted:  # what is written stays; curves.png shows the rows so far
        if st.main:
            plot_curves(st.log.rows(), RunFolder(st.dir).curves, **st.curves)
        run.close()
        raise
    except KeyboardInterrupt:  # a second signal: the step in progress is abandoned at once
        run.close()
        raise
    if after is None:
        steps = len(st.log.rows())
        run.close()
        return {"iterations": steps}
    log.info(eval_line("trained", after))
    plot_curves(st.log.rows(), RunFolder(st.dir).curves, held_out_marks(before, after), **st.curves)
    own = run.summary()
    run.close()
    return write_summary(st.dir, own, before=before, after=after, clock=st.clock, checkpoint=st.last_checkpoint)


def start(run: Run, resume: bool) -> bool:
    """The trainer readied (:meth:`Run.start`); a checkpoint it resumed from restores the run's state
    (:meth:`RunState.restore`) and says where the run stands (:func:`announce_resume`). Whether it resumed."""
    last, saved, k = run.start(resume)
    if last is None or saved is None:
        return False
    st = run.state
    st.restore(saved, k, last.name)
    announce_resume(log, st.name(k), last.name, st.name(k + 1) if k + 1 < st.total_steps else None,
                    f"every {st.singular} is done")
    return True


def save(run: Run, k: int) -> None:
    """Checkpoint step ``k`` (:meth:`Run.save`, with the run's state) and remember it."""
    run.state.saved(k, run.save(k, run.state.to_state()))


def train(run: Run) -> None:
    """The training steps from :attr:`RunState.first_step` to :attr:`RunState.total_steps`, each
    :func:`train_step`, until a budget forbids the next one (:meth:`RunState.budget_stop`) or a signal asks to stop
    (:class:`Interrupted`, before the first step or after the one in progress, which is checkpointed). A run
    stopped by a budget between checkpoints checkpoints its last step, so the weights evaluated after training
    are saved too."""
    st = run.state
    st.clock.start_training()  # the time budget covers training steps, not the evaluations
    done = saved = st.first_step - 1  # the last step trained, and the last checkpointed
    if st.stop.requested:  # asked during the evaluation before training
        raise st.interrupted(done)
    for k in range(st.first_step, st.total_steps):
        stopped_by = st.budget_stop()
        if stopped_by:
            log.info("%s reached after %d %s", stopped_by, k, st.unit)
            break
        train_step(run, k)
        done = k
        if checkpoint_due(st.cfg, k, st.total_steps):
            saved = k
    if done > saved:
        save(run, done)


def train_step(run: Run, k: int) -> dict[str, Any]:
    """Step ``k``: the trainer's step (timed: the time budget's estimate of the next one), its row logged, the
    guards (:meth:`RunState.check_guards`: they stop the run before its checkpoint, so the last one stays the last
    good one), a checkpoint when due (or when a signal asked to stop: then :class:`Interrupted` follows it). Returns
    the row."""
    st = run.state
    st.stop.doing = st.name(k)
    t0 = time.perf_counter()
    row = run.step(k)
    st.last_step_s = time.perf_counter() - t0
    st.log.log(k, row)
    st.check_guards(k)
    if checkpoint_due(st.cfg, k, st.total_steps) or st.stop.requested:
        save(run, k)
    if st.stop.requested:
        st.stop.doing = ""  # the step is checkpointed: a second signal from here abandons nothing of it
        raise st.interrupted(k)
    return row


def checkpoint_due(cfg: RunConfig, k: int, total: int) -> bool:
    """Whether step ``k`` is checkpointed: every ``train.save_every`` steps and the run's last."""
    return (k + 1) % cfg.train.save_every == 0 or k == total - 1


class Fits:
    """What callers ask of a trainer besides :class:`Run`'s methods: :meth:`fit`, :meth:`resume`, and (for ``slea
    train``'s stop lines) the run's stop signal, last checkpoint and the step it holds, :class:`RunState`'s."""

    state: RunState

    def fit(self, resume: bool = False) -> dict[str, Any]:
        """The run (:func:`slea.trainer.lifecycle.fit`); ``resume`` continues from the run folder's newest
        checkpoint."""
        return fit(cast("Run", self), resume)  # a trainer that subclasses Fits is a Run (slea/trainer/contract.py)

    def resume(self) -> bool:
        """Load the newest intact checkpoint and restore the run's state (:func:`start`) without training; whether
        there was one. A later ``fit()`` continues after it."""
        return start(cast("Run", self), True)

    @property
    def stop(self) -> StopSignal:
        return self.state.stop

    @property
    def last_checkpoint(self) -> str | None:
        return self.state.last_checkpoint

    @property
    def saved_step(self) -> str | None:
        return self.state.saved_step
