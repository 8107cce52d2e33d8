"""Training budgets: when a trainer stops starting new work (``train.time_budget_s``, ``train.rollout_budget``,
``train.env_step_budget``).

Both trainers check them before each unit of work (an iteration of slea/trainer/rl.py, a single-agent update of
slea/trainer/team.py), so a run stops at a clean boundary, checkpoints and evaluates as a finished run does;
``slea compare`` matches algorithms on these budgets (an RTPO iteration plays trunks plus siblings, a GRPO one
N × G episodes, a team one collection after every single-agent update).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slea.config import TrainSection


def budget_spent(elapsed_s: float, last_iteration_s: float, budget_s: float | None) -> bool:
    """Whether ``train.time_budget_s`` forbids starting another iteration: one is started only while it is
    expected (as long as the last one) to end less than half an iteration past the budget. The first iteration
    always starts (no last one: 0 s); ``None`` is no budget."""
    return budget_s is not None and elapsed_s + 0.5 * last_iteration_s > budget_s


def spent_budget(train: TrainSection, rollouts: int, env_steps: int) -> str:
    """Which of ``train.rollout_budget`` / ``train.env_step_budget`` is used up ('' when none is)."""
    if train.rollout_budget is not None and rollouts >= train.rollout_budget:
        return f"rollout budget of {train.rollout_budget} ({rollouts} played)"
    if train.env_step_budget is not None and env_steps >= train.env_step_budget:
        return f"env-step budget of {train.env_step_budget} ({env_steps} played)"
    return ""


def stop_reason(train: TrainSection, elapsed_s: float, last_s: float, rollouts: int, env_steps: int, *,
                agree: Callable[[bool], bool] = bool) -> str:
    """Which budget of ``train`` forbids starting the next unit of work ('' when none does): the time budget
    (:func:`budget_spent`, ``last_s`` the last unit's seconds; ``agree`` turns this process's answer into the one
    every process acts on, data-parallel: rank 0's) first, then :func:`spent_budget`."""
    if agree(budget_spent(elapsed_s, last_s, train.time_budget_s)):
        return f"time budget of {train.time_budget_s:.0f}s ({elapsed_s:.0f}s spent)"
    return spent_budget(train, rollouts, env_steps)
