"""Trainer.fit: a run stopped by its time budget between checkpoints still saves the weights it evaluates."""

import json
from pathlib import Path

import pytest
import torch

from slea.config import load_config
from slea.runs import checkpoint as ckpt

SMOKE = str(Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml")


@pytest.mark.slow
def test_a_budget_stop_between_saves_checkpoints_the_last_iteration(tmp_path):
    pytest.importorskip("textworld")
    from slea.trainer.rl import Trainer

    run = tmp_path / "run"
    # save_every 10 never comes round; a 1 ms budget lets one iteration start, none after it
    cfg = load_config(SMOKE, [f"run.dir={run}", "train.iterations=5", "train.save_every=10",
                              "train.time_budget_s=1e-3", "eval.before=false", "eval.greedy=false",
                              "eval.games=1", "eval.episodes_per_game=1", "env.max_steps=2"])
    summary = Trainer(cfg).fit()
    logged = [json.loads(x)["iteration"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert logged == [0]  # the budget check lets the first iteration run, then stops
    assert ckpt.latest_checkpoint(run / "checkpoints").name == "iter_000001"  # iteration 1, as the log counts
    assert summary["checkpoint"] == "iter_000001"


def test_full_finetune_kl_reference_is_the_frozen_starting_model(tmp_path):
    """``model.lora: false`` with a KL term: π_ref is a frozen copy of the starting weights, not the policy."""
    pytest.importorskip("textworld")
    from slea.trainer.rl import Trainer

    over = ["eval.before=false", "eval.greedy=false", "env.max_steps=2", "model.lora=false",
            "algorithm.kl_coef=0.1", "algorithm.skip_zero_advantage=false", "train.iterations=1",
            f"run.dir={tmp_path / 'run'}"]
    t = Trainer(load_config(SMOKE, over))
    assert t.reference is not None and t.reference is not t.model
    start = {n: p.detach().clone() for n, p in t.reference.named_parameters()}
    assert all(not p.requires_grad for p in t.reference.parameters())
    with torch.no_grad():  # stand in for earlier updates: the policy has moved away from its start
        for p in t.model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    m = t.iteration(0)
    ref_now = dict(t.reference.named_parameters())
    assert all(torch.equal(start[n], ref_now[n]) for n in start)  # the reference never moves
    assert m["update/kl"] > 0  # measured against the starting weights (the policy itself would give 0)
    t.log.close()


def test_budget_spent_starts_an_iteration_only_if_it_ends_within_half_an_iteration_of_the_budget():
    from slea.trainer.budgets import budget_spent

    assert not budget_spent(0.0, 0.0, 1e-3)  # the first iteration always starts
    assert not budget_spent(80.0, 30.0, 100.0)  # 80 + 15 = 95 ≤ 100: expected to end at 110, within 15 s
    assert budget_spent(90.0, 30.0, 100.0)  # 90 + 15 = 105 > 100
    assert not budget_spent(100.0, 0.0, 100.0)  # exactly at the budget with no estimate: 100 > 100 is false
    assert budget_spent(100.1, 0.0, 100.0)
    assert not budget_spent(1e9, 1e9, None)  # no budget

@pytest.mark.slow
def test_a_rollout_budget_stops_the_run_and_counts_siblings(tmp_path):
    """train.rollout_budget: rtpo's first iteration on the two-turn env plays 2 trunks and 2 siblings at each of
    their boundaries (2 + 2·2·2 = 10 rollouts when both trunks play 2 turns) and the budget of 5 ends the run."""
    from slea.trainer.budgets import spent_budget
    from slea.trainer.rl import Trainer

    run = tmp_path / "run"
    cfg = load_config(SMOKE, ["plugins=[slea.testing.two_turn]", "env.id=slea/FirstChoice-v0", "env.kwargs={}",
                              "env.eval_kwargs={}", "algorithm.name=rtpo", "algorithm.kl_coef=0",
                              "rollout.group_size=3", "rollout.max_new_tokens=1", "train.iterations=4",
                              "train.rollout_budget=5", "eval.before=false", "eval.greedy=false", "eval.games=1",
                              "eval.episodes_per_game=1", f"run.dir={run}"])
    Trainer(cfg).fit()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0]
    r = rows[0]
    assert r["rollouts"] == r["budget/rollouts"] == 2 + 2 * r["rollout/forked_boundaries"] >= 5
    assert ckpt.latest_checkpoint(run / "checkpoints").name == "iter_000001"
    train = cfg.train.model_copy(update={"rollout_budget": None, "env_step_budget": 10})
    assert spent_budget(train, 99, 9) == "" and "env-step budget of 10" in spent_budget(train, 0, 10)


@pytest.mark.slow
def test_the_time_budget_counts_the_training_seconds_before_a_resume(tmp_path):
    """train.time_budget_s covers the whole run (slea/trainer/run_state.py): a resumed run counts the training
    seconds its checkpoint had spent, as a team run does (tests/trainer/test_team_budget.py)."""
    pytest.importorskip("textworld")
    from slea.trainer.rl import Trainer

    run = tmp_path / "run"
    fast = [f"run.dir={run}", "train.iterations=3", "eval.before=false", "eval.greedy=false", "eval.games=1",
            "eval.episodes_per_game=1", "env.max_steps=2"]
    Trainer(load_config(SMOKE, [*fast, "train.rollout_budget=1"])).fit()  # the first iteration, then the stop
    spent = json.loads((ckpt.latest_checkpoint(run / "checkpoints") / "state.json").read_text())["train_s"]
    assert spent > 0
    # this process has trained for no time, but the run has: over a budget of 0.9× what it spent
    summary = Trainer(load_config(SMOKE, [*fast, f"train.time_budget_s={0.9 * spent}"])).fit(resume=True)
    assert summary["iterations"] == 1 and summary["checkpoint"] == "iter_000001"
    summary = Trainer(load_config(SMOKE, [*fast, "train.time_budget_s=100000"])).fit(resume=True)
    assert summary["iterations"] == 3
    state = json.loads((ckpt.latest_checkpoint(run / "checkpoints") / "state.json").read_text())
    assert state["train_s"] > spent  # the run's training seconds go on from the checkpoint's
