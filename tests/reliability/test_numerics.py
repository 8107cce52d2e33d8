"""Numerical guards: NaN/inf in the loss, the gradients or the advantages skip the update (and say so);
``train.max_bad_updates`` bad updates in a row stop the run with the last good checkpoint intact."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import slea.testing.faulty_env  # noqa: F401
from slea.config import AlgorithmSection, TrainSection
from slea.runs import checkpoint as ckpt
from slea.testing.faulty_env import FAULTY_ID
from slea.trainer import update as U
from slea.trainer.guards import BadUpdateGuard, RunHalted, check_fault_rate, nonfinite_count


def _samples(n=4):
    rng = random.Random(0)
    return [U.Sample([rng.randrange(5, 200) for _ in range(12)], [rng.randrange(5, 200) for _ in range(3)],
                     [-1.0, -1.2, -0.9], advantages=[1.0 if i % 2 else -1.0] * 3) for i in range(n)]


class _NanGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * float("nan")


@pytest.mark.parametrize("where", ["loss", "grad"])
def test_non_finite_loss_or_gradient_skips_the_step_and_keeps_the_weights(tiny_policy, monkeypatch, where):
    model, _ = tiny_policy
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    real = U.get_policy_loss("ppo_clip")

    def poisoned(logp, old, adv, mask, **kw):
        if where == "grad":  # a finite loss whose gradients are NaN
            logp = _NanGrad.apply(logp)
        loss, met = real(logp, old, adv, mask, **kw)
        if where == "loss":
            return loss * float("nan"), met
        assert torch.isfinite(loss)
        return loss, met

    monkeypatch.setattr(U, "get_policy_loss", lambda name: poisoned)
    opt = torch.optim.AdamW(params, lr=1e-2)
    out = U.ppo_update(model, opt, _samples(), AlgorithmSection(), TrainSection(updates_per_iter=2, micro_batch=4),
                       temperature=1.0, dtype="float32", rng=random.Random(0))
    assert out["skipped_updates"] == 2.0 and "grad_norm" not in out
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters()) and not any(opt.state.values())


def test_bad_update_guard_counts_streaks_and_stops():
    g = BadUpdateGuard(3)
    assert [g.observe(b) for b in (True, True, False, True, True)] == [1, 2, 0, 1, 2]
    g.check(4)
    g.observe(True)
    with pytest.raises(RunHalted, match=r"3 updates in a row hit NaN/inf.*last good checkpoint is iter_000004"):
        g.check(5, "iter_000004")
    never = BadUpdateGuard(0)
    for _ in range(10):
        never.observe(True)
    never.check(9)  # 0 disables the guard


def test_fault_rate_check_and_nonfinite_count():
    assert nonfinite_count(np.array([1.0, np.nan, np.inf, -np.inf, 0.0])) == 3
    assert check_fault_rate({"calls": 10, "faults": 2, "env_errors": 2}, 0.2, 0) == pytest.approx(0.2)
    with pytest.raises(RunHalted, match=r"3 of 10 env calls faulted \(30% > env.max_fault_rate=0.2; env_errors 3"
                                        r"\); last error: boom"):
        check_fault_rate({"calls": 10, "faults": 3, "env_errors": 3}, 0.2, 7, "boom")
    assert check_fault_rate({"calls": 0, "faults": 0}, 0.0, 0) == 0.0
    assert check_fault_rate({"calls": 5, "faults": 5}, 1.0, 0) == 1.0


def test_nan_rewards_skip_updates_then_stop_the_run_with_the_last_good_checkpoint(tmp_path, rel):
    from slea.trainer.rl import Trainer

    cfg = rel.tiny_config(env={"id": FAULTY_ID, "kwargs": {"inner": "slea/Sokoban-v0"}},
                          train={"iterations": 6, "max_bad_updates": 2})
    trainer = Trainer(cfg, run_dir=tmp_path)
    orig = trainer.iteration

    def poison_from_2(it):  # iterations 0-1 are clean, then every step's reward is NaN
        for env in trainer.pool.envs:
            env.nan_prob = 1.0 if it >= 2 else 0.0
        return orig(it)

    trainer.iteration = poison_from_2
    with pytest.raises(RunHalted, match=r"at iteration 4: 2 updates in a row hit NaN/inf .*last good checkpoint is "
                                        r"iter_000003"):
        trainer.fit()
    rows = trainer.log.rows()
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]
    assert [r["guard/bad_update_streak"] for r in rows] == [0, 0, 1, 2]
    assert rows[2]["guard/nonfinite_rewards"] > 0 and rows[2]["update/skipped_updates"] >= 1
    assert "update/loss" not in rows[2]  # skipped whole: no optimizer step ran
    # named by the iterations done (iter_000003: iteration 3, the first poisoned one, whose update was skipped)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "checkpoints")] == ["iter_000002", "iter_000003"]
    # the last good checkpoint is intact and finite; iteration 3's weights equal iteration 2's (no step taken)
    last = ckpt.latest_checkpoint(tmp_path / "checkpoints")
    assert last.name == "iter_000003" and ckpt.verify_checkpoint(last)
    from safetensors.torch import load_file

    w1 = load_file(str(tmp_path / "checkpoints/iter_000002/trainable.safetensors"))
    w2 = load_file(str(last / "trainable.safetensors"))
    assert all(torch.equal(w1[k], w2[k]) and torch.isfinite(w2[k]).all() for k in w1)


def test_non_finite_weights_are_never_checkpointed(tmp_path, rel):
    from slea.trainer.rl import Trainer

    cfg = rel.tiny_config(train={"iterations": 2})
    trainer = Trainer(cfg, run_dir=tmp_path)
    orig = trainer.iteration

    def corrupt_at_1(it):
        m = orig(it)
        if it == 1:
            with torch.no_grad():
                next(p for p in trainer.model.parameters() if p.requires_grad).fill_(float("nan"))
        return m

    trainer.iteration = corrupt_at_1
    with pytest.raises(RunHalted, match="stopped at iteration 2/2: the weights hold NaN/inf.*last good checkpoint is "
                                        "iter_000001"):
        trainer.fit()
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "checkpoints")] == ["iter_000001"]
