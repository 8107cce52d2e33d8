"""Env faults: an env that raises, hangs or dies ends its episode (truncated), is rebuilt, and the run goes on;
faults are counted; too many faults stop the run with a clear message."""

from __future__ import annotations

import math
import time

import pytest

import slea.envs
import slea.testing.faulty_env  # noqa: F401  (registers slea/test-Faulty-v0)
from slea.envs.pool import EnvCallTimeout, EnvPool, call_with_timeout
from slea.testing.faulty_env import FAULTY_ID, FaultyEnv, InjectedFault

SOKO = {"inner": "slea/Sokoban-v0"}


def _walk(pool: EnvPool, i: int) -> list[str]:
    return pool.last[i][1]["walkthrough"]


def test_a_crashing_step_truncates_the_episode_and_rebuilds_the_env():
    pool = EnvPool(FAULTY_ID, 1, 2, {**SOKO, "crash_prob": 1.0})
    pool.reset([3])
    dead = pool.envs[0]
    res = pool.step({0: "up", 1: "down"})
    for i in (0, 1):
        obs, reward, term, trunc, info = res[i]
        assert trunc and not term and reward == 0.0
        assert info["fault"] == "error" and "InjectedFault" in info["error"] and not info["invalid"]
        assert obs == pool.last[i][0]
    assert pool.all_done
    assert pool.envs[0] is not dead and not pool.envs[0].dead  # a fresh instance, same kwargs
    with pytest.raises(InjectedFault):
        dead.reset(seed=3)  # the old one is dead for good
    stats = pool.take_fault_stats()
    assert stats["env_errors"] == 2 and stats["restarts"] == 2 and stats["faults"] == 2 and stats["calls"] == 4
    assert pool.take_fault_stats()["calls"] == 0  # cleared
    pool.reset([4])  # the rebuilt envs play on
    assert pool.live() == [0, 1]


def test_a_hung_step_times_out_and_the_run_goes_on():
    pool = EnvPool(FAULTY_ID, 1, 1, {**SOKO, "hang_prob": 1.0, "hang_s": 30.0}, step_timeout_s=0.3)
    pool.reset([1])
    _, _, _, trunc, info = pool.step({0: "up"})[0]
    assert trunc and info["fault"] == "timeout"
    stats = pool.take_fault_stats()
    assert stats["env_timeouts"] == 1 and stats["restarts"] == 1
    pool.envs[0].hang_prob = 0.0
    pool.reset([1])
    _, _, _, trunc, info = pool.step({0: _walk(pool, 0)[0]})[0]
    assert not trunc and "fault" not in info


def test_timeouts_only_fire_on_slow_calls():
    assert call_with_timeout(lambda: 7, 1.0) == 7
    assert call_with_timeout(lambda: 8, None) == 8
    with pytest.raises(ZeroDivisionError):
        call_with_timeout(lambda: 1 / 0, 1.0)  # the worker's exception reaches the caller
    with pytest.raises(EnvCallTimeout):
        call_with_timeout(lambda: time.sleep(5), 0.05)


def test_a_reset_that_keeps_failing_sits_the_episode_out(tiny_policy):
    from slea.config import RolloutSection
    from slea.policy.generation import Generation
    from slea.policy.prompt_builder import PromptBuilder
    from slea.rollout.collector import RolloutCollector

    pool = EnvPool(FAULTY_ID, 2, 1, {**SOKO, "reset_crash_prob": 0.5})
    from slea.testing.faulty_env import unit

    seeds = [s for s in range(50) if unit(0, "reset", s) < 0.5][:1] + [s for s in range(50)
                                                                      if unit(0, "reset", s) >= 0.5][:1]
    out = pool.reset(seeds)
    assert out[0][1]["fault"] == "error" and pool.done.tolist() == [True, False]
    assert pool.take_fault_stats()["reset_errors"] == 2  # the retry on a fresh instance failed too

    class Fixed:
        def generate(self, prompts, **kw):
            return [Generation([5], [-0.1], "up") for _ in prompts]

    _, tok = tiny_policy
    col = RolloutCollector(Fixed(), PromptBuilder(tok), RolloutSection(), max_steps=2)
    trajs, _ = col.collect(pool, seeds)
    assert trajs[0].steps == [] and trajs[0].truncated  # skipped, never stepped
    assert len(trajs[1].steps) >= 1


def test_an_engine_exception_inside_the_env_is_a_fault_not_an_invalid_action():
    """The engine raises inside ``_step``: TextEnv.step's catch answers with a fault (the episode ends, no reward,
    no invalid flag, so no invalid-action penalty), and the env is left as the engine left it (dead here)."""
    env = FaultyEnv(crash_prob=1.0)
    obs, _ = env.reset(seed=3)
    got = env.step("up")
    assert got[:4] == (obs, 0.0, False, True)
    assert got[4]["fault"] == "error" and got[4]["invalid"] is False
    assert got[4]["error"] == "InjectedFault: injected crash at turn 0" and env.injected["crash"] == 1
    with pytest.raises(InjectedFault):
        env.reset(seed=3)  # a reset is not caught by the env: the pool's own guard handles it


def test_the_rollout_does_not_penalise_or_learn_from_an_engine_fault(tiny_policy):
    """Through the collector: the faulted step is valid (no invalid penalty), ends the episode truncated, carries
    ``fault``, so the trainer drops the episode (slea.trainer.guards.faulted)."""
    from slea.config import RolloutSection
    from slea.policy.generation import Generation
    from slea.policy.prompt_builder import PromptBuilder
    from slea.rollout.collector import RolloutCollector
    from slea.trainer.guards import faulted

    class Up:
        def generate(self, prompts, **kw):
            return [Generation([5], [-0.1], "up") for _ in prompts]

    pool = EnvPool(FAULTY_ID, 1, 2, {**SOKO, "crash_prob": 1.0})
    col = RolloutCollector(Up(), PromptBuilder(tiny_policy[1]), RolloutSection(invalid_penalty=0.5), max_steps=4)
    trajs, _ = col.collect(pool, [3])
    for t in trajs:
        (step,) = t.steps
        assert step.valid and step.penalty == 0.0 and step.reward == 0.0 and step.info["fault"] == "error"
        assert t.truncated and faulted(t)
    assert pool.take_fault_stats()["env_errors"] == 2


def test_with_handling_off_the_pool_passes_the_fault_through_without_rebuilding():
    pool = EnvPool(FAULTY_ID, 1, 1, {**SOKO, "crash_prob": 1.0}, handle_faults=False)
    pool.reset([0])
    env = pool.envs[0]
    _, _, _, trunc, info = pool.step({0: "up"})[0]
    assert trunc and info["fault"] == "error"
    assert pool.envs[0] is env and env.dead and pool.fault_counts["env_errors"] == 0  # not counted, not rebuilt
    with pytest.raises(InjectedFault):
        pool.reset([0])  # a reset's exception propagates


def test_fault_decisions_are_pure_functions_of_seed_turn_and_action():
    a = FaultyEnv(crash_prob=0.3, nan_prob=0.3, fault_seed=1)
    b = FaultyEnv(crash_prob=0.3, nan_prob=0.3, fault_seed=1)
    trace = []
    for env in (a, b):
        got = []
        for seed in range(6):
            env.dead = False
            env.reset(seed=seed)
            for act in ("up", "left", "down"):
                _, reward, _, _, info = env.step(act)
                if info.get("fault"):
                    got.append("crash")
                    break
                got.append(reward)
        trace.append([("nan" if isinstance(g, float) and math.isnan(g) else g) for g in got])
    assert trace[0] == trace[1] and "crash" in trace[0] and "nan" in trace[0]


def test_trainer_survives_crashes_and_hangs_and_logs_fault_counts(tmp_path, rel):
    from slea.trainer.rl import Trainer

    cfg = rel.tiny_config(env={"id": FAULTY_ID, "kwargs": {**SOKO, "crash_prob": 0.3, "hang_prob": 0.3,
                                                           "hang_s": 20.0},
                               "eval_kwargs": {"crash_prob": 0.0, "hang_prob": 0.0},
                               "step_timeout_s": 0.5, "max_fault_rate": 1.0},
                          train={"iterations": 3})
    trainer = Trainer(cfg, run_dir=tmp_path)
    trainer.fit()
    rows = trainer.log.rows()
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    assert sum(r["faults/env_errors"] for r in rows) >= 1 and sum(r["faults/env_timeouts"] for r in rows) >= 1
    assert sum(r["faults/dropped_episodes"] for r in rows) >= 1  # faulted episodes are not learned from
    assert all(r["faults/calls"] > 0 for r in rows)


def test_too_many_faults_stop_the_run_with_a_clear_message(tmp_path, rel):
    from slea.trainer.guards import RunHalted
    from slea.trainer.rl import Trainer

    cfg = rel.tiny_config(env={"id": FAULTY_ID, "kwargs": {**SOKO, "crash_prob": 1.0}, "max_fault_rate": 0.2},
                          train={"iterations": 3})
    trainer = Trainer(cfg, run_dir=tmp_path)
    with pytest.raises(RunHalted, match=r"env calls faulted .*env.max_fault_rate=0.2.*InjectedFault"):
        trainer.fit()
    assert [r["iteration"] for r in trainer.log.rows()] == [0]  # the row that tripped the guard is kept
    assert not (tmp_path / "checkpoints").exists() or not list((tmp_path / "checkpoints").iterdir())


def test_one_definition_of_a_faulted_episode():
    """Both trainers drop the same episodes: one whose step faulted, and one that never began (its reset or a
    fork's restore faulted: truncated, no step); an episode truncated by the turn limit is learned from."""
    from slea.trainer.guards import faulted
    from slea.types import Step, Trajectory

    def step(**info):
        return Step(group_id=0, traj_id=0, step=0, anchor="", prompt_ids=[1], response_ids=[2], old_logprobs=[-0.1],
                    info=info)

    assert faulted(Trajectory(0, 0, steps=[step(), step(fault="timeout")], truncated=True))
    assert faulted(Trajectory(0, 0, truncated=True))
    assert not faulted(Trajectory(0, 0, steps=[step()], truncated=True))
    assert not faulted(Trajectory(0, 0, steps=[step()]))
