"""The TeamTR stage loop with the tiny model on TextWorld: fresh rollouts after every single-agent update."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from pytest import approx

from slea.algorithms import get_algorithm
from slea.config import ConfigError, build_config, load_config
from slea.team import SharedContext
from slea.team.rollout import TeamEpisode
from slea.testing.team_signal import signal_algorithm as registered_signal
from slea.trainer.lifecycle import train_step
from slea.trainer.team import TeamTrainer, agent_samples, check_team_config, stage_order, stale_weights
from slea.types import Step, Trajectory

pytest.importorskip("textworld")

ROOT = Path(__file__).resolve().parents[2]
SIGNAL = "test_team_signal"
# the documented preset, cut to one stage of one task group. A random tiny model never scores, so every team
# return would be equal and every Eq.9 advantage 0: the stage runs with SIGNAL, an algorithm that needs a team and
# scores copy 0 of each task +1, copy 1 −1 (the trainer reads any algorithm's spec; Eq.9 is tested on its own).
# The k3 monitor (the default, never negative) makes "d̂ ≤ δ" telling.
OVERRIDES = ["rollout.groups=1", "team.max_turns=2", "team.order=reverse", "team.trust_region.min_steps=1",
             "team.trust_region.max_steps=3", "train.iterations=1",
             "train.lr=0.001", f"algorithm.name={SIGNAL}"]


def run_stage(tr: TeamTrainer, s: int) -> list[dict]:
    """Stage ``s`` of ``tr``: its single-agent updates, each logged and checkpointed as in a run (the lifecycle's
    step); their rows."""
    n = len(tr.task.roles)
    return [train_step(tr, k) for k in range(s * n, (s + 1) * n)]


@pytest.fixture
def signal_algorithm():
    with registered_signal(SIGNAL):
        yield SIGNAL


def test_stage_order():
    assert stage_order("fixed", 3, 0, 5) == [0, 1, 2]
    assert stage_order("reverse", 3, 0, 5) == [2, 1, 0]
    a = stage_order("random", 4, 1, 2)
    assert sorted(a) == [0, 1, 2, 3] and a == stage_order("random", 4, 1, 2)
    assert len({tuple(stage_order("random", 4, 1, s)) for s in range(8)}) > 1  # a new σ per stage


def _episode(traj_id, rewards, fault=False):
    """A planner (agent 0) + actor (agent 1) episode: one message each per move, the env reward on the actor's."""
    steps = []
    for move, r in enumerate(rewards):
        for agent in (0, 1):
            info = {"fault": "error"} if fault and agent == 1 else {}
            steps.append(Step(0, traj_id, 2 * move + agent, "obs", [1, 2], [3 + agent] * (agent + 1),
                              [-0.5] * (agent + 1), reward=r if agent else 0.0, info=info))
    return TeamEpisode(Trajectory(0, traj_id, steps=steps), [0, 1] * len(rewards), SharedContext())


def test_agent_samples_eq9_over_the_whole_team_then_the_agents_rows():
    # one task group: τ0 returns 1 (over two moves), τ1 returns 0; τ2 faulted (left out whatever it scored).
    # Eq.9 over {1, 0}: μ .5, σ sqrt(.25 + 0) = .5 → Ã = +1, −1 on every message of the rollout
    eps = [_episode(0, [0.0, 1.0]), _episode(1, [0.0, 0.0]), _episode(2, [5.0], fault=True)]
    spec = get_algorithm("teamtr")
    planner = agent_samples(eps, 0, spec, {"eps_norm": 0.0}, penalty_at="step", skip_zero=True)
    assert [s.advantages for s in planner] == [[1.0], [1.0], [-1.0], [-1.0]]  # 1 token per planner message
    actor = agent_samples(eps, 1, spec, {"eps_norm": 0.0}, penalty_at="step", skip_zero=True)
    assert [s.advantages for s in actor] == [[1.0, 1.0], [1.0, 1.0], [-1.0, -1.0], [-1.0, -1.0]]
    assert all(s.response_ids == [4, 4] for s in actor)
    # equal returns: every advantage 0, so no sample under skip_zero, four all-zero ones without it
    flat = [_episode(0, [1.0]), _episode(1, [1.0])]
    assert agent_samples(flat, 0, spec, {}, penalty_at="step", skip_zero=True) == []
    assert len(agent_samples(flat, 0, spec, {}, penalty_at="step", skip_zero=False)) == 2


def test_stale_weights_and_weighted_samples():
    # exp of the summed log-ratios, clipped to [1/5, 5]: [1, 2, 100 → 5, 1/100 → .2]
    assert stale_weights([0.0, np.log(2.0), np.log(100.0), -np.log(100.0)], 5.0).tolist() == approx(
        [1.0, 2.0, 5.0, 0.2])
    # the planner's advantages of _episode(0) (+1) and _episode(1) (−1) times weights 2 and .5; the faulted
    # third episode is dropped with its weight
    eps = [_episode(0, [0.0, 1.0]), _episode(1, [0.0, 0.0]), _episode(2, [5.0], fault=True)]
    planner = agent_samples(eps, 0, get_algorithm("teamtr"), {"eps_norm": 0.0}, penalty_at="step", skip_zero=True,
                            weights=[2.0, 0.5, 3.0])
    assert [s.advantages for s in planner] == [[2.0], [2.0], [-0.5], [-0.5]]


def test_config_checked_before_the_model_loads():
    with pytest.raises(ConfigError, match="trains no team"):
        check_team_config(build_config({"algorithm": {"name": "grpo"}}))
    with pytest.raises(ConfigError, match="env.id: team task textworld_planner_actor is written for"):
        check_team_config(build_config({"algorithm": {"name": "teamtr"}, "env": {"id": "slea/Sokoban-v0"}}))
    with pytest.raises(ConfigError, match="model.lora"):
        check_team_config(build_config({"algorithm": {"name": "teamtr"}, "model": {"lora": False}}))
    # settings the team trainer does not read are refused, not ignored: options.beta here (teamtr's loss takes a
    # beta, so the config check passes it), the others when the config loads (tests/config/test_team_settings.py)
    # and here again, for a config that loads unchecked (a `slea compare` sub-run's, when another algorithm reads them)
    with pytest.raises(ConfigError, match="algorithm.options.beta: TeamTR adapts β"):
        check_team_config(build_config({"algorithm": {"name": "teamtr", "options": {"beta": 0.5}}}))
    for section, key, value, message in [("algorithm", "kl_coef", 0.1, "algorithm.kl_coef: TeamTR's KL term"),
                                         ("algorithm", "dynamic_sampling", True, "algorithm.dynamic_sampling:"),
                                         ("experience", "mode", "step", "experience.mode: team rollouts")]:
        tree = {"algorithm": {"name": "teamtr"}, section: {key: value}} if section != "algorithm" else {
            "algorithm": {"name": "teamtr", key: value}}
        with pytest.raises(ConfigError, match=f"^{section}.{key}: algorithm teamtr trains a team"):
            build_config(tree)
        with pytest.raises(ConfigError, match=message):
            check_team_config(build_config(tree, check_unused=False))


def test_a_stage_resamples_after_every_agent_update_and_the_stale_baselines_do_not(tmp_path, signal_algorithm):
    cfg = load_config(ROOT / "configs/teamtr_smoke.yaml", OVERRIDES)
    tr = TeamTrainer(cfg, tmp_path / "run")
    events = []  # ("collect", draw, adapter states, episodes) and ("update", agent, samples) in order
    collect, update = tr.collector.collect, tr.update_agent

    def counting_collect(pool, seeds, **kw):
        states = [tr.team.state(0), tr.team.state(1)]
        episodes, stats = collect(pool, seeds, **kw)
        events.append(("collect", kw["draw"], states, episodes))
        return episodes, stats

    def counting_update(agent, samples):
        events.append(("update", agent, samples))
        return update(agent, samples)

    tr.collector.collect, tr.update_agent = counting_collect, counting_update
    rows = run_stage(tr, 0)
    kinds = [(e[0], e[1]) for e in events]
    # σ = reverse: actor (1) then planner (0); a fresh collection before each update and one after the last
    assert kinds == [("collect", 0), ("update", 1), ("collect", 1), ("update", 0), ("collect", 2)]
    s0, s1, s2 = (e[2] for e in events if e[0] == "collect")

    def same(a, b):
        return all(torch.equal(a[n], b[n]) for n in a)

    # update 1 moved the actor only: the planner's adapter is bit-identical, and the second collection was
    # played by that intermediate team (new actor, old planner)
    assert not same(s0[1], s1[1]) and same(s0[0], s1[0])
    # update 2 moved the planner only, on the intermediate team's messages (the second collection)
    assert not same(s1[0], s2[0]) and same(s1[1], s2[1])
    second = {tuple(s.response_ids) for e in events[2][3] for s in e.rows_of(0)}
    assert {tuple(s.response_ids) for s in events[3][2]} <= second

    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r.pop("iteration") for r in logged] == [0, 1]  # a row per single-agent update
    assert logged == json.loads(json.dumps(rows)) and [r["role"] for r in rows] == ["actor", "planner"]
    delta = cfg.team.trust_region.delta
    for r in rows:
        assert r["teamtr/steps"] >= 1 and 0 <= r["teamtr/token_kl"] <= delta and r["teamtr/beta"] > 0
        assert r["teamtr/samples"] > 0 and r["rollout/retokenized"] == 0
    assert rows[0]["team/return_after"] == rows[1]["team/return_before"]  # update 1's "after" is update 2's batch
    # the trust region's row says which estimator and over how many messages: every message of the agent in the
    # collection it learned from (the actor's in the first, the planner's in the second)
    for r, (agent, collection) in zip(rows, [(1, events[0][3]), (0, events[2][3])]):
        mine = sum(1 for e in collection for s, a in zip(e.trajectory.steps, e.agents) if a == agent and s.response_ids)
        assert r["teamtr/kl_estimator"] == "k3" and r["teamtr/kl_messages"] == mine > 0
        assert r["teamtr/token_kl_k3"] == r["teamtr/token_kl"] <= r["teamtr/kl_max"]
    assert sorted(p.name for p in (tmp_path / "run" / "adapters").iterdir()) == ["actor.safetensors",
                                                                                 "planner.safetensors"]

    # naive sequential (team.rollouts: stale): both updates learn from the stage's first rollouts
    tr.cfg.team.rollouts = "stale"
    events.clear()
    rows = run_stage(tr, 1)
    assert [(e[0], e[1]) for e in events] == [("collect", 3), ("update", 1), ("update", 0), ("collect", 5)]
    first = {tuple(s.response_ids) for e in events[0][3] for s in e.rows_of(0)}
    assert {tuple(s.response_ids) for s in events[2][2]} <= first  # the planner's samples are stale
    assert "team/return_after" not in rows[0] and "team/return_after" in rows[1]
    assert {abs(a) for s in events[2][2] for a in s.advantages} == {1.0}  # unweighted

    # importance-weighted stale rollouts: the planner's advantages carry the updated actor's likelihood ratios
    tr.cfg.team.rollouts = "stale_iw"
    events.clear()
    rows = run_stage(tr, 2)
    assert [(e[0], e[1]) for e in events] == [("collect", 6), ("update", 1), ("update", 0), ("collect", 8)]
    assert rows[0]["teamtr/iw_mean"] == rows[0]["teamtr/iw_max"] == 1.0  # nobody was updated before the actor
    weights = {abs(a) for s in events[2][2] for a in s.advantages}
    assert weights != {1.0} and all(0.2 <= w <= 5.0 for w in weights)
    tr.close()


def _varied_episode(group, traj_id, ret, rng, moves=3):
    """A planner + actor episode of ``moves`` moves with random prompt and response ids (the tiny model's vocab):
    every message differs, so a step on some of them shifts the others only through the shared weights."""
    steps = []
    for move in range(moves):
        for agent in (0, 1):
            steps.append(Step(group, traj_id, 2 * move + agent, "obs", rng.integers(10, 500, 10).tolist(),
                              rng.integers(10, 500, 4).tolist(), [-1.0] * 4,
                              reward=ret if agent and move == moves - 1 else 0.0))
    return TeamEpisode(Trajectory(group, traj_id, steps=steps), [0, 1] * moves, SharedContext())


def test_the_monitor_reads_every_message_of_the_agent_and_catches_an_update_outside_delta(tmp_path):
    # task group 0 returns 1 and 0 (Eq.9: Ã = ±1 on the planner's 6 messages there); groups 1 and 2 return equal
    # values (Ã = 0 on the other 12). The loss skips zero advantages here, so the step trains 6 of 18 messages;
    # the monitor (Eq.11's M_j) must still read all 18. lr .05 is large: one step leaves δ.
    rng = np.random.default_rng(0)
    episodes = [_varied_episode(g, 2 * g + k, r, rng) for g, rets in enumerate([(1.0, 0.0), (0.0, 0.0), (1.0, 1.0)])
                for k, r in enumerate(rets)]
    cfg = load_config(ROOT / "configs/teamtr_smoke.yaml",
                      ["train.lr=0.05", "team.trust_region.min_steps=2", "team.trust_region.max_steps=2",
                       "team.trust_region.beta=0.01", "algorithm.skip_zero_advantage=true"])
    assert cfg.team.trust_region.kl_estimator == "k3"  # the default
    tr = TeamTrainer(cfg, tmp_path / "run")
    messages = tr.samples_for(0, episodes)
    assert len(messages) == 18  # all of the planner's messages, zero advantages included
    trained = tr.trained(messages)
    assert sum(trained) == 6 and all(any(s.advantages) == t for s, t in zip(messages, trained))

    seen = []  # per measurement: (messages measured, d̂ on the 12 untrained ones, d̂ on the 6 trained ones)
    measure = tr.measure_kl

    def spy(samples):
        zero = [s for s in samples if not any(s.advantages)]
        some = [s for s in samples if any(s.advantages)]
        seen.append((len(samples), measure(zero), measure(some)))
        return measure(samples)

    tr.measure_kl = spy
    before = tr.team.state(0)
    res = tr.update_agent(0, messages)
    # the first step is caught: d̂ over all 18 messages is past δ, and β doubles after each step outside
    assert res.kl_history[0] > cfg.team.trust_region.delta and all(k >= 0 for k in res.kl_history)
    assert res.beta_history == [0.01, 0.02] and res.beta == approx(0.04)
    # d̂ is the mean over all messages, the 12 the step never trained on included, and those moved too
    assert [n for n, _, _ in seen] == [18, 18, 18]  # after steps 1, 2 and after the restore
    _, untrained, trained_kl = seen[0]
    assert untrained > 0 and res.kl_history[0] == approx((12 * untrained + 6 * trained_kl) / 18, rel=1e-4)
    # the penalty of step 2 ran over all 18 too: its d̂ (at the weights after step 1) is the monitor's reading
    assert res.step_metrics["penalty_kl"] == approx(res.kl_history[0], rel=1e-6)
    # both steps ended outside: the update is undone, back at the pre-update adapter where d̂ is exactly 0
    assert res.reverted and res.kl == 0.0 and tr.last_kl == {"k1": 0.0, "k3": 0.0, "messages": 18}
    after = tr.team.state(0)
    assert all(torch.equal(before[k], after[k]) for k in before)
    tr.close()
