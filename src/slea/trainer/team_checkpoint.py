"""Checkpoints of a team run, and resuming one (the TeamTR trainer, slea/trainer/team.py).

After every single-agent update (every ``train.save_every`` updates, and when a budget stops the run) :func:`save`
writes an atomic checkpoint ``checkpoints/iter_<update>/`` through :func:`slea.runs.checkpoint.
save_checkpoint`: every agent's adapter, every agent's optimizer (:class:`slea.runs.checkpoint.OptimizerSet`),
the RNG states, and in ``state.json`` the stage and position in σ, β per agent, the counters (updates, episodes,
messages, env steps, training seconds: the budgets already spent) and, mid-stage, the rollouts the stage's next
update learns from (and the ``stale_iw`` log-ratios), so no collection is replayed.

``slea train --resume RUN`` (:func:`resume`) continues from the newest intact one: rows logged after it are
dropped and those updates redone, giving the uninterrupted run's adapters bit for bit (CPU, same
``run.threads``; tests/trainer/test_team_resume.py).

They are the ``save`` and ``resume`` methods of :class:`slea.trainer.team.TeamTrainer`, which inherits them from
:class:`TeamCheckpoints` (so this module needs nothing of the trainer's), and read or set its fields.
"""

from __future__ import annotations

import logging

import numpy as np

from slea.runs import checkpoint as ckpt
from slea.runs.folder import RunFolder
from slea.team.rollout import episode_from_state, episode_state
from slea.trainer.lifecycle import announce_resume, check_saveable, load_resume_point

log = logging.getLogger("slea.trainer.team")  # the team trainer's log lines, wherever they are written from


class TeamCheckpoints:
    """Checkpoint and resume methods of the TeamTR trainer (module docstring)."""

    def save(self, k: int) -> None:
        """Checkpoint single-agent update ``k``, the one just logged (``checkpoints/iter_<k + 1>``: named by the
        updates done, as the log lines count them): every agent's
        adapter and optimizer, the RNG states, and in ``state.json`` the stage and position, β per agent, the
        counters and the pending rollouts (what the stage's next update learns from; ``None`` after a stage's last
        update). Weights that hold NaN/inf are never written (:class:`RunHalted`)."""
        check_saveable(self.weights.values(), self.step_name(k), self.last_checkpoint)
        stage, position = divmod(k, len(self.task.roles))
        pending = self.pending
        rollouts = None if pending is None else {"episodes": [episode_state(e) for e in pending[0]],
                                                 "log_ratio": [float(x) for x in pending[1]]}
        path = ckpt.save_checkpoint(
            RunFolder(self.dir).checkpoints, k, self.weights, self.optimizer_set, keep=self.cfg.train.keep_checkpoints,
            number=k + 1,
            extra={"stage": stage, "position": position, "updates": self.updates, "episodes": self.episodes,
                   "messages": self.messages, "env_steps": self.env_steps, "betas": list(self.betas),
                   "train_s": self.train_s + self.clock.training_seconds(), "agents": list(self.task.agents),
                   "wall_s": self.clock.seconds(),
                   "pending": rollouts})
        self.last_checkpoint = path.name
        self.saved_step = self.step_name(k)

    def resume(self) -> bool:
        """Continue from the newest intact checkpoint (damaged ones are skipped with a warning), as the single-agent
        trainer does: adapters, optimizers, RNGs, β, counters and the position in the stage; rows logged after it are
        dropped (those updates are redone). Without a checkpoint the run starts over (``False``); with only damaged
        ones it stops (:class:`RunHalted`) and changes nothing."""
        last, state, k = load_resume_point(RunFolder(self.dir).checkpoints, self.weights, self.optimizer_set, self.log)
        if state is None:
            return False
        self.updates, self.episodes, self.messages = (int(state[key]) for key in ("updates", "episodes", "messages"))
        self.env_steps, self.train_s = int(state.get("env_steps", 0)), float(state.get("train_s", 0.0))
        self.clock.before = float(state.get("wall_s", 0.0))
        self.betas = [float(b) for b in state["betas"]]
        rollouts = state.get("pending")
        # the update after the checkpoint's: mid-stage it learns from the rollouts the checkpoint kept; after a
        # stage's last update (none kept) it opens the next stage
        self.first_step = int(state["stage"]) * len(self.task.roles) + int(state["position"]) + 1
        self.pending = None if rollouts is None else (
            [episode_from_state(e) for e in rollouts["episodes"]], np.asarray(rollouts["log_ratio"], dtype=np.float64))
        self.last_checkpoint = last.name
        self.saved_step = self.step_name(k)
        # one numbering in every line a person reads: stages and updates count from 1 (checkpoint folders from 0)
        announce_resume(log, self.saved_step, last.name,
                        self.step_name(self.first_step) if self.first_step < self.total_steps else None,
                        "every stage is done")
        return True
