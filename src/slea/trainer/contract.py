"""Both trainers satisfy the run lifecycle's contract, :class:`slea.trainer.lifecycle.Run` (its :class:`RunState` and
the methods ``start``, ``step``, ``save``, ``evaluate``, ``summary``, ``close``), checked statically: a type checker
(``mypy src/slea/trainer/contract.py``) verifies that each function below may return its trainer as a ``Run``, so a
method renamed, dropped or given another signature in either trainer fails the check. Nothing here runs;
tests/trainer/test_contract.py checks the same at run time."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the trainers load torch and their models' code: a type checker reads them, nothing imports them
    from slea.trainer.lifecycle import Run
    from slea.trainer.rl import Trainer
    from slea.trainer.team import TeamTrainer


def single_agent_conforms(trainer: Trainer) -> Run:
    return trainer


def team_conforms(trainer: TeamTrainer) -> Run:
    return trainer
