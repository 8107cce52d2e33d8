"""Team rollouts with the tiny model: the shared context in turn order, each agent under its own adapter."""

from __future__ import annotations

import pytest
import torch

from slea.config import RolloutSection
from slea.envs.pool import EnvPool
from slea.policy.generation import Generation, HFGenerator
from slea.team import SharedContext, get_router, get_team_task
from slea.team.prompt_builder import TeamPromptBuilder, team_turn
from slea.team.rollout import TeamCollector
from slea.trainer.update import Sample, response_logprobs

TW = "slea/TextWorld-v0"
TW_KW = {"tasks": ["coin_collector:1"], "num_games": 2}


def _collector(team, task_name, gen, max_turns, **rollout):
    task = get_team_task(task_name)
    builder = TeamPromptBuilder(team.tok, context_messages=6, message_max_chars=120)
    return TeamCollector(team, gen, builder, task, get_router("round_robin"), RolloutSection(**rollout), max_turns)


def test_transcript_and_team_turn_layout():
    ctx = SharedContext()
    ctx.add("env", "You are in a  kitchen.\nThere is a door.")
    ctx.add("planner", "x" * 50, 0)
    # 20 chars: the first 17 of the whitespace-collapsed text, then "..."
    assert ctx.transcript(5, 20) == ["[env] You are in a kitc...", "[planner] " + "x" * 17 + "..."]
    assert ctx.transcript(1, 100) == ["[planner] " + "x" * 50]
    assert ctx.observation.startswith("You are in a")
    assert team_turn("win", ["[env] hi"], ["go"], "Cue:") == "Goal: win\nTeam transcript:\n[env] hi\nValid commands:\n- go\nCue:"


def test_planner_actor_team_on_textworld(team, perturb):
    pytest.importorskip("textworld")
    perturb(team, 1, seed=5)  # the actor differs from the planner: old log-probs tell whose adapter spoke
    gen = HFGenerator(team.model, team.tok, dtype="float32")
    col = _collector(team, "textworld_planner_actor", gen, max_turns=4, max_new_tokens=6)
    pool = EnvPool(TW, 2, 2, TW_KW)
    torch.manual_seed(0)
    episodes, stats = col.collect(pool, [0, 1])
    assert col.calls == 1 and len(episodes) == 4
    for ep in episodes:
        n = len(ep.agents)
        assert ep.agents == [0, 1, 0, 1][:n] and n in (2, 4)  # round robin; an episode may end at a move
        # the shared context: the observation, then plan, action, the env's answer, in that order
        assert ep.context.speakers() == ["env", "planner", "actor", "env", "planner", "actor", "env"][:1 + n // 2 * 3]
        assert [s.step for s in ep.trajectory.steps] == list(range(n))
        for s in ep.rows_of(0):
            assert s.reward == 0.0 and s.penalty == 0.0 and s.info["role"] == "planner"
            assert "Valid commands:" not in team.tok.decode(s.prompt_ids)
        for s in ep.rows_of(1):
            assert "Valid commands:" in team.tok.decode(s.prompt_ids)
            assert s.reward == pytest.approx(-0.1) if not s.valid else s.reward >= 0.0
        # the actor read the planner's message of the same move
        plan, act = ep.trajectory.steps[0], ep.trajectory.steps[1]
        assert f"[planner] {' '.join(plan.response_text.split())[:40]}" in team.tok.decode(act.prompt_ids)
        assert ep.trajectory.steps[-1].done
    # one generation call per (turn, agent chosen): every live episode shares the round-robin agent
    turns = max(len(ep.agents) for ep in episodes)
    assert gen.calls == stats.gen_calls == turns
    # each row's old log-probs are its own agent's: recomputed under that adapter they match, under the other not
    rows = [(s, a) for ep in episodes for s, a in zip(ep.trajectory.steps, ep.agents) if s.response_ids]
    for agent in (0, 1):
        mine = [Sample(s.prompt_ids, s.response_ids, s.old_logprobs, []) for s, a in rows if a == agent]
        with team.acting(agent):
            own, mask = response_logprobs(team.model, mine, dtype="float32", share_prefix=False)
        with team.acting(1 - agent):
            other, _ = response_logprobs(team.model, mine, dtype="float32", share_prefix=False)
        old = torch.zeros_like(own)
        for i, s in enumerate(mine):
            old[i, own.shape[1] - len(s.old_logprobs):] = torch.tensor(s.old_logprobs)
        assert torch.allclose(own, old * mask, atol=1e-4)
        assert not torch.allclose(other, old * mask, atol=1e-2)


class ScriptedTeam:
    """A stand-in for the generator *and* the team's ``activate``: answers by the active role, from a script."""

    def __init__(self, script):
        self.script = script  # role -> list of answers, used in turn
        self.active = None
        self.used = {}
        self.calls = 0

    def activate(self, agent):
        self.active = ["proposer", "critic"][agent]

    def generate(self, prompts, **kw):
        self.calls += 1
        k = self.used.get(self.active, 0)
        self.used[self.active] = k + 1
        return [Generation([5, 6], [-0.1, -0.2], self.script[self.active][k]) for _ in prompts]


def test_proposer_critic_team_on_search_qa(tiny_policy):
    pytest.importorskip("fanoutqa")
    _, tok = tiny_policy
    pool = EnvPool("slea/SearchQA-v0", 1, 2, {"num_questions": 4})
    gold = pool.reset([0])[0][1]["answers"][0]
    script = {"proposer": ["Search for the films.", f"Answer {gold}: the documents list them."],
              "critic": ["<think> need evidence </think> <search> Star Wars films </search>",
                         f"<think> supported </think> <answer> {gold} </answer>"]}
    fake = ScriptedTeam(script)
    fake.tok = tok
    col = _collector(fake, "searchqa_proposer_critic", fake, max_turns=6)
    episodes, _ = col.collect(pool, [0])
    for ep in episodes:
        assert ep.agents == [0, 1, 0, 1]
        assert ep.context.speakers() == ["env", "proposer", "critic", "env", "proposer", "critic", "env"]
        assert ep.context.messages[3].text.startswith("<information>")  # the search's documents
        assert ep.trajectory.won and ep.team_return == pytest.approx(1.0)
        assert [s.reward for s in ep.trajectory.steps] == [0.0, 0.0, 0.0, 1.0]  # the critic's answer scores
        assert ep.trajectory.steps[-1].done and not ep.trajectory.truncated
    assert fake.calls == 4  # one call per turn: both copies answer together
