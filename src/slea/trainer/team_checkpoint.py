"""Checkpoints of a team run, and resuming one (the TeamTR trainer, slea/trainer/teamtr.py).

After every single-agent update (every ``train.save_every`` updates, and when a budget stops the run) :func:`save`
writes an atomic checkpoint ``checkpoints/iter_<update>/`` through :func:`slea.trainer.checkpoint.
save_checkpoint`: every agent's adapter, every agent's optimizer (:class:`slea.trainer.checkpoint.OptimizerSet`),
the RNG states, and in ``state.json`` the stage and position in σ, β per agent, the counters (updates, episodes,
messages, env steps, training seconds: the budgets already spent) and, mid-stage, the rollouts the stage's next
update learns from (and the ``stale_iw`` log-ratios), so no collection is replayed.

``slea train --resume RUN`` (:func:`resume`) continues from the newest intact one: rows logged after it are
dropped and those updates redone, giving the uninterrupted run's adapters bit for bit (CPU, same
``run.threads``; tests/trainer/test_teamtr_resume.py).

Both functions take the :class:`slea.trainer.teamtr.TeamTrainer` they act on (they are its ``save`` and
``resume`` methods) and read or set its fields.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from slea.team.rollout import TeamEpisode, episode_from_state, episode_state
from slea.trainer import checkpoint as ckpt
from slea.trainer.guards import RunHalted
from slea.trainer.runlog import truncate_metrics

if TYPE_CHECKING:
    from slea.trainer.teamtr import TeamTrainer

log = logging.getLogger("slea.trainer.teamtr")  # the team trainer's log lines, wherever they are written from


def save(tr: TeamTrainer, stage: int, position: int, pending: tuple[list[TeamEpisode], np.ndarray] | None) -> None:
    """Checkpoint the update just logged (``checkpoints/iter_<update>``): every agent's adapter and optimizer,
    the RNG states, and in ``state.json`` the stage and position, β per agent, the counters and ``pending`` (what
    the stage's next update learns from; ``None`` after a stage's last update). Weights that hold NaN/inf are
    never written (:class:`RunHalted`)."""
    u = tr.updates - 1
    if not all(bool(torch.isfinite(p).all()) for p in tr.weights.values()):
        raise RunHalted(f"stopped at update {u}: the adapters hold NaN/inf, so no checkpoint was written; the "
                        f"last good checkpoint is {tr.last_checkpoint}")
    rollouts = None if pending is None else {"episodes": [episode_state(e) for e in pending[0]],
                                             "log_ratio": [float(x) for x in pending[1]]}
    path = ckpt.save_checkpoint(
        tr.dir / "checkpoints", u, tr.weights, tr.optimizer_set, keep=tr.cfg.train.keep_checkpoints,
        extra={"stage": stage, "position": position, "updates": tr.updates, "episodes": tr.episodes,
               "messages": tr.messages, "env_steps": tr.env_steps, "betas": list(tr.betas),
               "train_s": tr.train_s + time.perf_counter() - tr.t_train, "agents": list(tr.task.agents),
               "pending": rollouts})
    tr.last_checkpoint, tr.unsaved = path.name, None


def resume(tr: TeamTrainer) -> bool:
    """Continue from the newest intact checkpoint (damaged ones are skipped with a warning), as the single-agent
    trainer does: adapters, optimizers, RNGs, β, counters and the position in the stage; rows logged after it are
    dropped (those updates are redone). Without a checkpoint the run starts over (``False``); with only damaged
    ones it stops (:class:`RunHalted`) and changes nothing."""
    root = tr.dir / "checkpoints"
    last, state = ckpt.load_latest(root, tr.weights, tr.optimizer_set)
    if state is None and ckpt.list_checkpoints(root):
        raise RunHalted(f"--resume: no checkpoint in {root} loads (see the warnings); nothing was changed. "
                        f"Move that folder away to start the run over.")
    u = int(state["iteration"]) if state is not None else -1
    truncate_metrics(tr.log.path, u)
    tr.log.purge_after(u)
    if state is None:
        return False
    tr.updates, tr.episodes, tr.messages = (int(state[k]) for k in ("updates", "episodes", "messages"))
    tr.env_steps, tr.train_s = int(state.get("env_steps", 0)), float(state.get("train_s", 0.0))
    tr.betas = [float(b) for b in state["betas"]]
    stage, position, rollouts = int(state["stage"]), int(state["position"]), state.get("pending")
    if rollouts is None:  # the checkpoint closed its stage
        tr.start, tr.pending = (stage + 1, 0), None
    else:
        tr.start = (stage, position + 1)
        tr.pending = ([episode_from_state(e) for e in rollouts["episodes"]],
                      np.asarray(rollouts["log_ratio"], dtype=np.float64))
    tr.last_checkpoint = last.name
    nxt = (f"next: stage {tr.start[0] + 1}, update {tr.start[1] + 1}"
           if tr.start[0] < tr.cfg.train.iterations else "every stage done")
    log.info("resumed from %s (%s)", last.name, nxt)
    return True
