"""slea/trainer/budgets.py: which budget stops a run (time first, then rollouts, then env steps)."""

from slea.config import TrainSection
from slea.trainer.budgets import stop_reason


def test_stop_reason_names_the_spent_budget_or_nothing():
    free = TrainSection()
    assert stop_reason(free, 1e9, 1e9, 10**9, 10**9) == ""  # no budget set
    train = TrainSection(time_budget_s=100.0, rollout_budget=8, env_step_budget=20)
    assert stop_reason(train, 80.0, 30.0, 7, 19) == ""  # 80 + 15 ≤ 100, 7 < 8, 19 < 20
    assert stop_reason(train, 90.0, 30.0, 0, 0) == "time budget of 100s (90s spent)"
    assert stop_reason(train, 0.0, 0.0, 8, 0) == "rollout budget of 8 (8 played)"
    assert stop_reason(train, 0.0, 0.0, 0, 25) == "env-step budget of 20 (25 played)"
