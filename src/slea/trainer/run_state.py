"""A run's state outside its weights, one object for both trainers (slea/trainer/rl.py, slea/trainer/team.py).

:class:`RunState` holds what the run lifecycle (slea/trainer/lifecycle.py) reads and writes between a trainer's
steps:

* where the run writes: its folder, whether this process writes it (data-parallel: rank 0 alone), its metrics log;
* its steps: how many, what one is called (``unit``, :meth:`RunState.name`), the one training starts from, the last
  checkpoint and the step it holds;
* its clock (:class:`WallClock`) and the budgets' counters (rollouts, env steps), which :meth:`RunState.budget_stop`
  checks before every step;
* the stop a signal asked for (:class:`slea.trainer.interrupt.StopSignal`);
* the guards (slea/trainer/guards.py): ``train.max_bad_updates`` non-finite updates in a row
  (:class:`BadUpdateGuard`) or more than ``env.max_fault_rate`` of a step's env calls faulted stop the run, checked
  after the step's row is logged and before its checkpoint (:meth:`RunState.check_guards`).

A checkpoint's ``state.json`` keeps :meth:`RunState.to_state` (``rollouts``, ``env_steps``, ``bad_update_streak``,
``train_s``, ``wall_s``) beside the trainer's own keys; a resume restores it (:meth:`RunState.restore`). A key that
an older checkpoint lacks counts 0 (``rollouts``: its ``episodes``).

The time budget (``train.time_budget_s``) covers the whole run, like a wall-time limit: it counts the training
seconds of every process of the run, those of the earlier ones up to their last checkpoint (``train_s``) plus this
one's. A resumed run therefore stops when the run as a whole has used its budget, not after another budget's worth
of training. The held-out evaluations are not counted, nor the seconds an earlier process spent after its last
checkpoint (those steps are redone, and counted then).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from slea.config import RunConfig
from slea.runs.runlog import RunLog
from slea.trainer.budgets import stop_reason
from slea.trainer.guards import BadUpdateGuard, check_fault_rate
from slea.trainer.interrupt import Interrupted, StopSignal


class WallClock:
    """A run's seconds over all its processes. :meth:`seconds`: wall seconds, those of the earlier processes up to
    their last checkpoint (:attr:`before`) plus this process's since its fit began (:meth:`restart`).
    :meth:`training_seconds`: seconds of training steps, the earlier processes' (:attr:`train_before`) plus this
    process's since :meth:`start_training` (the evaluations before training are not counted)."""

    def __init__(self) -> None:
        self.before = self.train_before = 0.0
        self.start = self.train_start = time.perf_counter()

    def restart(self) -> None:
        self.start = time.perf_counter()

    def seconds(self) -> float:
        return self.before + time.perf_counter() - self.start

    def start_training(self) -> None:
        self.train_start = time.perf_counter()

    def training_seconds(self) -> float:
        return self.train_before + time.perf_counter() - self.train_start


class RunState:
    """One run's state outside its weights (module docstring). ``total_steps`` steps, each a ``unit`` (plural, for
    the log: ``"iterations"``) named by ``name(k)`` (``"iteration 3/10"``); ``agree(flag)`` is the flag every process
    acts on (data-parallel: rank 0's); ``curves`` are ``plot_curves``' keywords for the run's ``curves.png``."""

    def __init__(self, cfg: RunConfig, dir: Path, log: RunLog, *, total_steps: int, unit: str,
                 name: Callable[[int], str], main: bool = True, agree: Callable[[bool], bool] = bool,
                 curves: Mapping[str, Any] | None = None) -> None:
        self.cfg, self.dir, self.log, self.main = cfg, Path(dir), log, main
        self.total_steps, self.unit, self.name, self.agree = total_steps, unit, name, agree
        self.curves = dict(curves or {})
        self.clock = WallClock()
        self.stop = StopSignal()  # SIGINT / SIGTERM while `slea train` runs (slea/trainer/interrupt.py)
        self.guard = BadUpdateGuard(cfg.train.max_bad_updates)
        self.first_step = 0  # the step training starts from: 0, or the one after a resumed checkpoint
        self.last_checkpoint: str | None = None  # its folder name
        self.saved_step: str | None = None  # the step it holds, as the log lines name it
        self.rollouts = self.env_steps = 0  # what the budgets count, over the whole run
        self.last_step_s = 0.0  # the last step's seconds: the time budget's estimate of the next one
        self.stopped_by = ""  # the budget that stopped the run ('' while none did)
        self.faults: Mapping[str, float] = {}  # the last step's env fault counts
        self.last_error = ""  # and the latest env error

    @property
    def singular(self) -> str:
        """What one step is (``"iteration"``), as the guards' messages say it."""
        return self.unit.removesuffix("s")

    # -- what a checkpoint keeps ------------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        """The ``state.json`` keys of this state, as of now."""
        return {"rollouts": self.rollouts, "env_steps": self.env_steps, "bad_update_streak": self.guard.streak,
                "train_s": self.clock.training_seconds(), "wall_s": self.clock.seconds()}

    def saved(self, k: int, checkpoint: str) -> None:
        """Step ``k`` was checkpointed in the folder ``checkpoint``."""
        self.last_checkpoint, self.saved_step = checkpoint, self.name(k)

    def restore(self, state: Mapping[str, Any], k: int, checkpoint: str) -> None:
        """Continue after step ``k``, checkpointed in ``checkpoint`` with ``state`` (:meth:`to_state`'s keys)."""
        self.saved(k, checkpoint)
        self.first_step = k + 1
        self.rollouts = int(state.get("rollouts", state.get("episodes", 0)))
        self.env_steps = int(state.get("env_steps", 0))
        self.guard.streak = int(state.get("bad_update_streak", 0))
        self.clock.train_before = float(state.get("train_s", 0.0))
        self.clock.before = float(state.get("wall_s", 0.0))

    # -- before a step: the budgets ---------------------------------------------------------------------------
    def budget_stop(self) -> str:
        """Which budget forbids starting the next step ('' when none does; then kept in :attr:`stopped_by`):
        ``train.time_budget_s`` against the run's training seconds (module docstring; the next step expected to
        take as long as the last, :func:`slea.trainer.budgets.budget_spent`), then ``train.rollout_budget`` and
        ``train.env_step_budget`` against the rollouts and env steps played."""
        self.stopped_by = stop_reason(self.cfg.train, self.clock.training_seconds(), self.last_step_s, self.rollouts,
                                      self.env_steps, agree=self.agree)
        return self.stopped_by

    # -- after a step: the guards -----------------------------------------------------------------------------
    def note_faults(self, faults: Mapping[str, float], last_error: str) -> None:
        """The step's env fault counts (``calls``, ``faults``, ... of :meth:`slea.envs.pool.EnvPool.take_fault_stats`)
        and the latest env error, for :meth:`check_guards`."""
        self.faults, self.last_error = dict(faults), last_error

    def check_guards(self, k: int) -> None:
        """:class:`slea.trainer.guards.RunHalted` when step ``k`` ends a streak of ``train.max_bad_updates`` bad
        updates (the trainer tells :attr:`guard` each step's) or more than ``env.max_fault_rate`` of its env calls
        faulted (:meth:`note_faults`)."""
        where = f"{self.singular} {k + 1}"
        self.guard.check(where, self.last_checkpoint)
        check_fault_rate(self.faults, self.cfg.env.max_fault_rate, where, self.last_error, self.last_checkpoint)

    def interrupted(self, k: int) -> Interrupted:
        """The stop a signal asked for, after step ``k`` (-1: before any in this process)."""
        where = self.name(k) if k >= 0 else ""
        if k == self.total_steps - 1:
            where += f" (every {self.singular} done: `--resume` runs the held-out evaluation)"
        return Interrupted(self.stop.requested or "SIGINT", where, self.dir, self.last_checkpoint)
