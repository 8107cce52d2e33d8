"""Run-level reliability guards: when a run must stop, and why, in one clear sentence. Both trainers apply them
after each step (an iteration, or a team's single-agent update), through
:meth:`slea.trainer.run_state.RunState.check_guards`.

* Numerical guard: ``ppo_update`` (the team's trust-region steps likewise) skips an optimizer step whose gradient
  norm or loss is non-finite; the trainer skips the whole update when an advantage is non-finite.
  :class:`BadUpdateGuard` counts steps in a row whose update hit a non-finite value and stops the run after
  ``train.max_bad_updates`` of them — before that step's checkpoint is written, so the last checkpoint is the
  last good one.
* Env fault guard: :func:`check_fault_rate` stops the run when, in one step, more than ``env.max_fault_rate`` of
  the env calls faulted (raised, hung, or could not be rebuilt). An episode a fault ended (:func:`faulted`) is
  reported but never learned from, by either trainer.
* The save guard, :func:`slea.trainer.lifecycle.check_saveable`, keeps a checkpoint of non-finite weights from
  ever being written.

Stopping raises :class:`RunHalted`; the CLI prints its message and exits with code 3.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

from slea.types import Trajectory


class RunHalted(RuntimeError):
    """A reliability guard stopped the run; the message says why and which checkpoint is the last good one."""


def nonfinite_count(values: np.ndarray | Iterable[float]) -> int:
    arr = np.asarray(values, dtype=np.float64)
    return int(arr.size - np.isfinite(arr).sum())


def faulted(t: Trajectory) -> bool:
    """Whether an env fault ended the episode: a step raised or hung (its row's ``info`` has ``fault``), or the
    episode never began (truncated with no step: its reset, or a fork's restore, faulted). Such an episode says
    nothing about the policy, so no trainer learns from it (docs/reliability.md, "Env faults")."""
    return (t.truncated and not t.steps) or any("fault" in s.info for s in t.steps)


class BadUpdateGuard:
    """Counts consecutive bad updates (a step whose update skipped at least one optimizer step, or was skipped
    whole, because of a non-finite value). ``max_bad`` in a row → :class:`RunHalted`."""

    def __init__(self, max_bad: int, streak: int = 0) -> None:
        self.max_bad = int(max_bad)
        self.streak = int(streak)

    def observe(self, bad: bool) -> int:
        """Record one step's update; returns the current streak."""
        self.streak = self.streak + 1 if bad else 0
        return self.streak

    def check(self, step: int | str, last_checkpoint: str | None = None) -> None:
        """:class:`RunHalted` when the streak reached ``max_bad`` (0 disables the guard); ``step`` where the run
        is, as :func:`at` says it."""
        if self.max_bad > 0 and self.streak >= self.max_bad:
            where = f"the last good checkpoint is {last_checkpoint}" if last_checkpoint else "no checkpoint yet"
            raise RunHalted(f"stopped at {at(step)}: {self.streak} updates in a row hit NaN/inf "
                            f"(loss, advantages or gradients; train.max_bad_updates={self.max_bad}); {where}. "
                            f"Lower train.lr, check rewards, or raise train.max_bad_updates.")


def at(step: int | str) -> str:
    """Where a run stopped, in its messages: a step's name (``"single-agent update 3"``), or an iteration's number
    as the log lines count it, from 1 (``3`` is ``"iteration 3"``)."""
    return f"iteration {step}" if isinstance(step, int) else step


def fault_rate(stats: Mapping[str, float]) -> float:
    calls = float(stats.get("calls", 0))
    return float(stats.get("faults", 0)) / calls if calls else 0.0


def check_fault_rate(stats: Mapping[str, float], max_rate: float, step: int | str, last_error: str = "",
                     last_checkpoint: str | None = None) -> float:
    """A step's env fault rate; :class:`RunHalted` when it exceeds ``max_rate`` (``max_rate >= 1`` never stops);
    ``step`` where the run is, as :func:`at` says it."""
    rate = fault_rate(stats)
    if rate > max_rate and not math.isclose(rate, max_rate):
        where = f"the last good checkpoint is {last_checkpoint}" if last_checkpoint else "no checkpoint yet"
        detail = ", ".join(f"{k} {int(v)}" for k, v in stats.items()
                           if v and k not in ("calls", "faults", "dropped_episodes"))
        raise RunHalted(f"stopped at {at(step)}: {int(stats.get('faults', 0))} of "
                        f"{int(stats.get('calls', 0))} env calls faulted ({rate:.0%} > env.max_fault_rate="
                        f"{max_rate:g}; {detail}); last error: {last_error or 'n/a'}; {where}. Resume with "
                        f"`slea train --resume RUN` once the environment is fixed.")
    return rate
