"""Checkpoints of a team run, and resuming one (the TeamTR trainer, slea/trainer/teamtr.py).

After every single-agent update (every ``train.save_every`` updates, and when a budget stops the run) :func:`save`
writes an atomic checkpoint ``checkpoints/iter_<update>/`` through :func:`slea.runs.checkpoint.
save_checkpoint`: every agent's adapter, every agent's optimizer (:class:`slea.runs.checkpoint.OptimizerSet`),
the RNG states, and in ``state.json`` the stage and position in σ, β per agent, the counters (updates, episodes,
messages, env steps, training seconds: the budgets already spent) and, mid-stage, the rollouts the stage's next
update learns from (and the ``stale_iw`` log-ratios), so no collection is replayed.

``slea train --resume RUN`` (:func:`resume`) continues from the newest intact one: rows logged after it are
dropped and those updates redone, giving the uninterrupted run's adapters bit for bit (CPU, same
``run.threads``; tests/trainer/test_teamtr_resume.py).

They are the ``save`` and ``resume`` methods of :class:`slea.trainer.teamtr.TeamTrainer`, which inherits them from
:class:`TeamCheckpoints` (so this module needs nothing of the trainer's), and read or set its fields.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from slea.runs import checkpoint as ckpt
from slea.team.rollout import TeamEpisode, episode_from_state, episode_state
from slea.trainer.lifecycle import announce_resume, check_saveable, load_resume_point

log = logging.getLogger("slea.trainer.teamtr")  # the team trainer's log lines, wherever they are written from


class TeamCheckpoints:
    """Checkpoint and resume methods of the TeamTR trainer (module docstring)."""

    def save(self, stage: int, position: int, pending: tuple[list[TeamEpisode], np.ndarray] | None) -> None:
        """Checkpoint the update just logged (``checkpoints/iter_<update>``): every agent's adapter and optimizer,
        the RNG states, and in ``state.json`` the stage and position, β per agent, the counters and ``pending`` (what
        the stage's next update learns from; ``None`` after a stage's last update). Weights that hold NaN/inf are
        never written (:class:`RunHalted`)."""
        u = self.updates - 1
        check_saveable(self.weights.values(), f"update {u}", self.last_checkpoint)
        rollouts = None if pending is None else {"episodes": [episode_state(e) for e in pending[0]],
                                                 "log_ratio": [float(x) for x in pending[1]]}
        path = ckpt.save_checkpoint(
            self.dir / "checkpoints", u, self.weights, self.optimizer_set, keep=self.cfg.train.keep_checkpoints,
            extra={"stage": stage, "position": position, "updates": self.updates, "episodes": self.episodes,
                   "messages": self.messages, "env_steps": self.env_steps, "betas": list(self.betas),
                   "train_s": self.train_s + time.perf_counter() - self.t_train, "agents": list(self.task.agents),
                   "wall_s": self.clock.seconds(),
                   "pending": rollouts})
        self.last_checkpoint, self.unsaved = path.name, None
        self.saved_step = self._step_name(stage, position)

    def _step_name(self, stage: int, position: int) -> str:
        """A single-agent update as the log lines number it (from 1): ``stage 2/3, update 1/2``."""
        return f"stage {stage + 1}/{self.cfg.train.iterations}, update {position + 1}/{len(self.task.roles)}"


    def resume(self) -> bool:
        """Continue from the newest intact checkpoint (damaged ones are skipped with a warning), as the single-agent
        trainer does: adapters, optimizers, RNGs, β, counters and the position in the stage; rows logged after it are
        dropped (those updates are redone). Without a checkpoint the run starts over (``False``); with only damaged
        ones it stops (:class:`RunHalted`) and changes nothing."""
        last, state, _ = load_resume_point(self.dir / "checkpoints", self.weights, self.optimizer_set, self.log)
        if state is None:
            return False
        self.updates, self.episodes, self.messages = (int(state[k]) for k in ("updates", "episodes", "messages"))
        self.env_steps, self.train_s = int(state.get("env_steps", 0)), float(state.get("train_s", 0.0))
        self.clock.before = float(state.get("wall_s", 0.0))
        self.betas = [float(b) for b in state["betas"]]
        stage, position, rollouts = int(state["stage"]), int(state["position"]), state.get("pending")
        if rollouts is None:  # the checkpoint closed its stage
            self.start, self.pending = (stage + 1, 0), None
        else:
            self.start = (stage, position + 1)
            self.pending = ([episode_from_state(e) for e in rollouts["episodes"]],
                          np.asarray(rollouts["log_ratio"], dtype=np.float64))
        self.last_checkpoint = last.name
        self.saved_step = self._step_name(stage, position)
        # one numbering in every line a person reads: stages and updates count from 1 (checkpoint folders from 0)
        announce_resume(log, self.saved_step, last.name,
                        self._step_name(*self.start) if self.start[0] < self.cfg.train.iterations else None,
                        "every stage is done")
        return True
