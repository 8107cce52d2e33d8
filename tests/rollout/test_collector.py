"""The rollout loop with the tiny model on real TextWorld games: 2 task groups x 2 copies."""

import pytest
import torch

from slea.config import RolloutSection
from slea.envs.pool import EnvPool
from slea.policy.generation import Generation, HFGenerator
from slea.policy.prompt_builder import PromptBuilder
from slea.rollout.collector import RolloutCollector
from slea.rollout.view import FEEDBACK_MAX_CHARS, invalid_feedback

pytest.importorskip("textworld")
ENV = "slea/TextWorld-v0"
KW = {"tasks": ["coin_collector:1"], "num_games": 2}


class Scripted:
    """A generator stand-in that answers from a script (to test parsing and penalties deterministically)."""

    def __init__(self, answers):
        self.answers = answers
        self.calls = 0
        self.prompts = []  # per call, the prompts it got

    def generate(self, prompts, **kw):
        self.calls += 1
        self.prompts.append(prompts)
        return [Generation([7, 8], [-0.5, -0.5], self.answers(self.calls, i)) for i in range(len(prompts))]


def test_tiny_model_rollout_one_generation_call_per_turn(tiny_policy):
    model, tok = tiny_policy
    gen = HFGenerator(model, tok, dtype="float32")
    cfg = RolloutSection(max_new_tokens=6, history=1)
    col = RolloutCollector(gen, PromptBuilder(tok, history=1), cfg, max_steps=3)
    pool = EnvPool(ENV, 2, 2, KW)
    torch.manual_seed(0)
    trajs, stats = col.collect(pool, [0, 1])
    assert len(trajs) == 4
    turns = max(len(t.steps) for t in trajs)
    assert gen.calls == turns == stats.gen_calls  # one batched call per turn across all live envs
    assert [t.group_id for t in trajs] == [0, 0, 1, 1]
    assert len({t.traj_id for t in trajs}) == 4
    for t in trajs:
        assert 1 <= len(t.steps) <= 3
        assert [s.step for s in t.steps] == list(range(len(t.steps)))
        assert t.steps[-1].done and not any(s.done for s in t.steps[:-1])
        for s in t.steps:
            assert s.prompt_ids and len(s.response_ids) == len(s.old_logprobs) >= 1
            assert s.anchor and "Your command" not in s.anchor  # raw observation, not the prompt
            if not s.valid:
                assert s.reward == pytest.approx(-cfg.invalid_penalty)
    # copies of one task group start from the same observation
    assert trajs[0].steps[0].anchor == trajs[1].steps[0].anchor


def test_invalid_answers_are_penalised_and_do_not_step(tiny_policy):
    _, tok = tiny_policy
    pool = EnvPool(ENV, 1, 2, KW)
    # copy 0 babbles, copy 1 plays the walkthrough's first command via an admissible match
    first_obs, info = pool.reset([0])[0]
    walk = info["walkthrough"]

    def answers(call, i):
        return "blah blah ###" if i == 0 else walk[min(call - 1, len(walk) - 1)]

    gen = Scripted(answers)
    cfg = RolloutSection(invalid_penalty=0.25)
    col = RolloutCollector(gen, PromptBuilder(tok), cfg, max_steps=len(walk) + 1)
    trajs, stats = col.collect(pool, [0])
    bad, good = trajs
    assert all(not s.valid for s in bad.steps) and len(bad.steps) == len(walk) + 1
    assert all(s.anchor == first_obs for s in bad.steps)  # the env was never stepped
    assert sum(s.reward for s in bad.steps) == pytest.approx(-0.25 * len(bad.steps))
    assert all(s.penalty == 0.25 for s in bad.steps) and all(s.penalty == 0.0 for s in good.steps)
    assert "Your last answer was invalid" not in tok.decode(gen.prompts[0][0])  # nothing to say at turn 0
    assert "Your last answer was invalid: it is not one of the valid commands." in tok.decode(gen.prompts[-1][0])
    assert not any("Your last answer was invalid" in tok.decode(p[1]) for p in gen.prompts if len(p) > 1)
    assert good.won and good.steps[-1].reward == pytest.approx(1.0) and len(good.steps) == len(walk)
    assert stats.parse_kinds["invalid"] == len(bad.steps)


class FakeExperience:
    def __init__(self):
        self.retrieved, self.clustered = 0, 0

    def cluster(self, obs, task_type="", *, state_key=""):
        self.clustered += 1
        return len(obs) % 5

    def retrieve(self, obs, *, task_type="", goal="", iteration=0, state_key="", slots=None):
        from types import SimpleNamespace

        self.retrieved += 1
        self.keys = getattr(self, "keys", []) + [(state_key, dict(slots or {}))]
        return SimpleNamespace(cluster_id=42, entry_ids=[1, 2], text="Strategy: take the coin.")


@pytest.mark.parametrize("mode", ["step", "task", "off"])
def test_experience_modes(tiny_policy, mode):
    _, tok = tiny_policy
    exp = FakeExperience()
    seen_prompts = []

    class Spy(Scripted):
        def generate(self, prompts, **kw):
            seen_prompts.extend(prompts)
            return super().generate(prompts, **kw)

    col = RolloutCollector(Spy(lambda c, i: "zzz"), PromptBuilder(tok), RolloutSection(), max_steps=2,
                           experience=exp, experience_mode=mode)
    trajs, _ = col.collect(EnvPool(ENV, 1, 2, KW), [0])
    steps = [s for t in trajs for s in t.steps]
    text_in_prompt = ["Strategy: take the coin." in tok.decode(p) for p in seen_prompts]
    if mode == "off":
        assert exp.retrieved == 0 and exp.clustered == len(steps) and not any(text_in_prompt)
        assert all(s.experience_ids == [] for s in steps)
    else:
        assert all(text_in_prompt) and all(s.experience_ids == [1, 2] for s in steps)
        if mode == "step":
            assert exp.retrieved == len(steps) and all(s.cluster_id == 42 for s in steps)
            # TextWorld gives every observation a state key: the library got it, and the step row keeps it
            assert all(s.state_key and s.state_slots.get("goal object") for s in steps)
            assert exp.keys == [(s.state_key, s.state_slots) for s in steps]
        else:  # task mode: one retrieval per episode, the cluster still per step's observation
            assert exp.retrieved == 2 and exp.clustered == len(steps)
            assert all(s.cluster_id == len(s.anchor) % 5 for s in steps)


@pytest.mark.parametrize("where", ["system", "user"])
def test_retrieved_experience_goes_where_the_rollout_config_says(tiny_policy, where):
    """``rollout.experience_in``: the text retrieved at each step is in the system message or in the step's own
    user turn, just before the answer cue, in the ids that are generated from (and trained on)."""
    _, tok = tiny_policy
    seen = []

    class Spy(Scripted):
        def generate(self, prompts, **kw):
            seen.extend(prompts)
            return super().generate(prompts, **kw)

    cfg = RolloutSection(experience_in=where)
    col = RolloutCollector(Spy(lambda c, i: "zzz"), PromptBuilder.from_rollout(tok, cfg), cfg, max_steps=2,
                           experience=FakeExperience(), experience_mode="step")
    trajs, _ = col.collect(EnvPool(ENV, 1, 1, KW), [0])
    assert seen and [s.prompt_ids for t in trajs for s in t.steps] == [list(p) for p in seen]
    for p in seen:
        text = tok.decode(p)
        system, last_user = text.split("<|im_end|>")[0], text.rsplit("<|im_start|>user", 1)[1]
        assert ("Strategy: take the coin." in system) == (where == "system")
        assert ("Strategy: take the coin.\nYour command:" in last_user) == (where == "user")


def test_invalid_feedback_prefers_the_envs_own_words():
    hint = "My previous action is invalid. If I want to search, I should put the query between <search> and </search>."
    assert invalid_feedback("Question: who?", hint, {"invalid": True, "error": "no tag"}) == hint
    long = hint * 2
    assert invalid_feedback("Q", long, {}) == long[:FEEDBACK_MAX_CHARS - 3].rstrip() + "..."
    # the same observation back: the env's error says why
    assert invalid_feedback("room", "room", {"error": "Not a valid action: answer up, down, left or right."}) \
        == "Not a valid action: answer up, down, left or right."
    assert invalid_feedback("room", None, {}) == "it is not one of the valid commands."


def test_boundaries_and_forks_continue_the_trunk_exactly(tiny_policy):
    """A trunk records one boundary per turn (its prompt c_k verbatim); siblings forked at turn 1 that answer as
    the trunk did replay its rows from turn 1 on, generating first from the recorded c_1; a restore that
    faults leaves an empty truncated sibling."""
    from dataclasses import replace

    _, tok = tiny_policy
    moves = ["up", "left", "down", "right", "up"]
    trunk_gen = Scripted(lambda call, i: moves[call - 1])
    col = RolloutCollector(trunk_gen, PromptBuilder(tok, history=2), RolloutSection(), max_steps=4)
    trunks, _ = col.collect(EnvPool("slea/Sokoban-v0", 1, 1), [5], boundaries=True)
    (trunk,) = trunks
    assert len(trunk.steps) >= 3 and [b.turn for b in trunk.boundaries] == [s.step for s in trunk.steps]
    assert [b.prompt_ids for b in trunk.boundaries] == [s.prompt_ids for s in trunk.steps]
    assert trunk.boundaries[2].past[-1][1] == trunk.steps[1].action and trunk.boundaries[0].context == "last 2 turns"

    sib_gen = Scripted(lambda call, i: moves[call])  # from turn 1 on, the trunk's answers
    col.gen = sib_gen
    b1 = trunk.boundaries[1]
    sibs, _ = col.fork(EnvPool("slea/Sokoban-v0", 1, 2), {0: (trunk, b1), 1: (trunk, b1)}, traj_offset=10)
    assert sib_gen.prompts[0] == [b1.prompt_ids, b1.prompt_ids]  # c_1 as recorded, not rebuilt
    key = lambda s: (s.step, s.anchor, s.prompt_ids, s.action, s.reward, s.done)
    for s in sibs:
        assert s.traj_id in (10, 11) and s.group_id == 0 and s.seed == trunk.seed
        assert [key(r) for r in s.steps] == [key(r) for r in trunk.steps[1:]]
        assert s.won == trunk.won and s.truncated == trunk.truncated
    broken = replace(b1, env_state={"room": None})
    sibs, _ = col.fork(EnvPool("slea/Sokoban-v0", 1, 2), {1: (trunk, broken)})
    assert len(sibs) == 1 and sibs[0].steps == [] and sibs[0].truncated
    with pytest.raises(ValueError, match="one boundary turn"):
        col.fork(EnvPool("slea/Sokoban-v0", 1, 2), {0: (trunk, b1), 1: (trunk, trunk.boundaries[0])})


def test_a_summary_psi_is_recorded_at_the_boundaries_and_is_in_c_k(tiny_policy):
    _, tok = tiny_policy
    moves = ["up", "left", "down", "right", "up"]
    col = RolloutCollector(Scripted(lambda call, i: moves[call - 1]), PromptBuilder(tok, history=1, summary=True),
                           RolloutSection(), max_steps=4)
    (trunk,), _ = col.collect(EnvPool("slea/Sokoban-v0", 1, 1), [5], boundaries=True)
    assert len(trunk.steps) >= 3 and trunk.boundaries[0].context == "last 1 turns + a summary of the earlier actions"
    c2 = tok.decode(trunk.boundaries[2].prompt_ids)
    first = trunk.steps[0].action
    assert f"Earlier actions: {first} (1 turn)" in c2  # turn 0's action summarised, turn 1's shown in full
    assert "Earlier actions" not in tok.decode(trunk.boundaries[1].prompt_ids)
