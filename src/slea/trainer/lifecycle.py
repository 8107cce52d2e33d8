"""One run lifecycle, the part both trainers share (the single-agent :class:`slea.trainer.rl.Trainer` and the team's
:class:`slea.trainer.teamtr.TeamTrainer`); each adds only what is its own.

* the save guard (:func:`check_saveable`): weights that hold NaN/inf are never checkpointed, the run stops
  (:class:`slea.trainer.guards.RunHalted`) naming the last good checkpoint;
* resume (:func:`load_resume_point`): the newest intact checkpoint is loaded, the rows logged after it dropped (those
  steps are redone); none at all starts the run over, only damaged ones refuse and change nothing;
  :func:`announce_resume` says where the run stands, in the numbering every log line uses (from 1);
* the held-out evaluations' log lines (:func:`eval_line`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from slea.trainer import checkpoint as ckpt
from slea.trainer.guards import RunHalted
from slea.trainer.runlog import RunLog, truncate_metrics


def check_saveable(weights: Iterable[torch.Tensor], where: str, last_checkpoint: str | None) -> None:
    """:class:`RunHalted` when a tensor of ``weights`` (what a checkpoint would hold) is not finite: no checkpoint
    of them is written, and the message names ``where`` the run stopped and the last good checkpoint."""
    if not all(bool(torch.isfinite(p).all()) for p in weights):
        raise RunHalted(f"stopped at {where}: the weights hold NaN/inf, so no checkpoint was written; the last good "
                        f"checkpoint is {last_checkpoint}")


def load_resume_point(root: Path, weights, optimizer, run_log: RunLog) -> tuple[Path | None, dict[str, Any] | None, int]:
    """Load the newest intact checkpoint under ``root`` into ``weights`` and ``optimizer``
    (:func:`slea.trainer.checkpoint.load_latest`: damaged ones are skipped with a warning) and drop what
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


def eval_line(label: str, res: dict) -> str:
    """A held-out evaluation's log line (``label``: untrained, trained)."""
    s = res["sampled"]
    g = res.get("greedy")
    greedy = f", greedy {g['success']:.2f}" if g else ""
    return (f"held-out ({label}): sampled success {s['success']:.2f} (invalid {s['invalid_rate']:.2f})"
            f"{greedy}  [{res['wall_s']:.0f}s]")
