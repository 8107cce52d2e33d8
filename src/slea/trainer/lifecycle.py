"""One run lifecycle, the part both trainers share (the single-agent :class:`slea.trainer.rl.Trainer` and the team's
:class:`slea.trainer.teamtr.TeamTrainer`); each adds only what is its own.

* the save guard (:func:`check_saveable`): weights that hold NaN/inf are never checkpointed, the run stops
  (:class:`slea.trainer.guards.RunHalted`) naming the last good checkpoint;
* resume (:func:`load_resume_point`): the newest intact checkpoint is loaded, the rows logged after it dropped (those
  steps are redone); none at all starts the run over, only damaged ones refuse and change nothing;
  :func:`announce_resume` says where the run stands, in the numbering every log line uses (from 1);
* the run folder (:func:`run_dir_for`, unless the caller names one) and the seeds of python, numpy and torch
  (:func:`seed_everything`);
* the run folder's ``config.yaml``, written first (:func:`write_config`);
* the held-out evaluation before training (:func:`evaluation_before`: run once, read back on resume) and after it,
  their log lines (:func:`eval_line`) and their marks on ``curves.png`` (:func:`held_out_marks`);
* the run's wall time over all its processes (:class:`WallClock`: a checkpoint keeps it, a resume restores it) and
  ``eval/summary.json``, written last so its presence marks a finished run (:func:`write_summary`).

Each trainer's ``fit`` is this skeleton: config, resume, the evaluation before, its own training loop, the
evaluation after, curves and summary.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from slea.atomic import atomic_write_text
from slea.config import RunConfig, dump_config
from slea.evaluation.evaluate import write_eval
from slea.runs import checkpoint as ckpt
from slea.runs.runlog import RunLog, truncate_metrics
from slea.trainer.guards import RunHalted
from slea.trainer.interrupt import StopSignal

log = logging.getLogger(__name__)


def run_dir_for(cfg: RunConfig) -> Path:
    """The run folder: ``run.dir``, else ``runs/<run.name>``, else ``runs/<date-time>``."""
    if cfg.run.dir:
        return Path(cfg.run.dir)
    name = cfg.run.name or datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / name


def seed_everything(seed: int) -> None:
    """Seed python's, numpy's and torch's global generators (a run's start; env seeds are separate)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def write_config(run_dir: Path, cfg: RunConfig) -> None:
    """``<run>/config.yaml``, the resolved config, written atomically before anything else (a kill must not cost
    the config: ``--resume`` reads it)."""
    atomic_write_text(Path(run_dir) / "config.yaml", dump_config(cfg))


class WallClock:
    """A run's wall seconds over all its processes: those of the earlier ones up to their last checkpoint
    (:attr:`before`, restored on resume) plus this process's since its fit began (:meth:`restart`)."""

    def __init__(self) -> None:
        self.before = 0.0
        self.start = time.perf_counter()

    def restart(self) -> None:
        self.start = time.perf_counter()

    def seconds(self) -> float:
        return self.before + time.perf_counter() - self.start


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
    path = Path(run_dir) / "eval" / "before.json"
    return json.loads(path.read_text()) if path.is_file() else None


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
    write_eval(Path(run_dir), "summary", summary)
    return summary


def eval_line(label: str, res: dict) -> str:
    """A held-out evaluation's log line (``label``: untrained, trained)."""
    s = res["sampled"]
    g = res.get("greedy")
    greedy = f", greedy {g['success']:.2f}" if g else ""
    return (f"held-out ({label}): sampled success {s['success']:.2f} (invalid {s['invalid_rate']:.2f})"
            f"{greedy}  [{res['wall_s']:.0f}s]")
