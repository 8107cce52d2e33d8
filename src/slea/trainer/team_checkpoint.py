"""What a team run's checkpoint keeps of a stage in progress (the TeamTR trainer, slea/trainer/team.py).

Mid-stage, the stage's next single-agent update learns from the rollouts the update before it left (and, for the
``stale_iw`` baseline, their log-ratios): a checkpoint keeps them in ``state.json`` (``pending``), so a resumed run
enters the stage where it stopped and replays no collection, giving the uninterrupted run's adapters bit for bit
(CPU, same ``run.threads``; tests/trainer/test_team_resume.py). :func:`pending_state` writes them, and
:func:`pending_from_state` reads them back. The rest of a team checkpoint is written and read by
:meth:`slea.trainer.team.TeamTrainer.save` and :meth:`~slea.trainer.team.TeamTrainer.load`, beside the run's state
(:class:`slea.trainer.run_state.RunState`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from slea.team.rollout import TeamEpisode, episode_from_state, episode_state

Pending = tuple[list[TeamEpisode], np.ndarray]  # the rollouts the stage's next update learns from, their log-ratios


def pending_state(pending: Pending | None) -> dict[str, Any] | None:
    """``pending`` as ``state.json`` keeps it (``None`` after a stage's last update: the next update collects)."""
    if pending is None:
        return None
    return {"episodes": [episode_state(e) for e in pending[0]], "log_ratio": [float(x) for x in pending[1]]}


def pending_from_state(saved: dict[str, Any] | None) -> Pending | None:
    """What :func:`pending_state` wrote, back as the trainer holds it."""
    if saved is None:
        return None
    return [episode_from_state(e) for e in saved["episodes"]], np.asarray(saved["log_ratio"], dtype=np.float64)
