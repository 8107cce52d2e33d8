"""The TeamTR control: slea/Ballot-v0 and the ``ballot_volunteer`` team task. The env follows the contract and is
deterministic; held-out games use chores never seen in training; a team that follows a convention wins every game
and a random team wins n/2^n; no member's prompt shows another member's list (what its vote meant)."""

from __future__ import annotations

import math
import random
import re
from types import SimpleNamespace

import pytest
from gymnasium.utils.env_checker import check_env

import slea.envs  # noqa: F401  (registers slea/Ballot-v0)
from slea.config import RolloutSection
from slea.envs import make, registered
from slea.envs.ballot import CHORES, VOTES, BallotEnv, generate_game, graded_reward, scripted, success
from slea.envs.pool import EnvPool
from slea.policy.generation import Generation
from slea.team import get_router, get_team_task
from slea.team.prompt_builder import TeamPromptBuilder
from slea.team.rollout import TeamCollector


def test_success_formula_hand_computed():
    assert success(0.5, 4) == pytest.approx(4 / 16)  # a random team of four: 1/4
    assert success(0.5, 3) == pytest.approx(3 / 8)
    assert success(0.25, 4) == pytest.approx(4 * 0.25 * 0.75**3)  # 0.421875, the best symmetric policy of four
    assert max(success(p / 1000, 4) for p in range(1001)) == pytest.approx(0.421875)
    assert success(0.0, 4) == success(1.0, 4) == 0.0


def test_graded_reward_hand_computed():
    assert [graded_reward(k, 4) for k in range(5)] == pytest.approx([2 / 3, 1.0, 2 / 3, 1 / 3, 0.0])
    assert [graded_reward(k, 2) for k in range(3)] == pytest.approx([0.0, 1.0, 0.0])


@pytest.mark.parametrize("reward", ["exact", "graded"])
def test_the_reward_of_every_count(reward):
    pairs = generate_game("train", 0).ballots
    for takes in range(5):
        env = BallotEnv(reward=reward)
        env.reset(seed=0)
        for j, pair in enumerate(pairs):
            _, r, term, _, info = env.step(pair[0] if j < takes else pair[1])
        assert term and info["takes"] == takes and info["won"] == (takes == 1)
        assert r == pytest.approx({"exact": [0, 1, 0, 0, 0], "graded": [2 / 3, 1, 2 / 3, 1 / 3, 0]}[reward][takes])
    with pytest.raises(ValueError, match="reward must be one of"):
        BallotEnv(reward="shaped")


def test_registered_and_passes_gymnasiums_checker():
    assert registered()["slea/Ballot-v0"].family == "ballot"
    check_env(make("slea/Ballot-v0"), skip_render_check=True)
    check_env(make("slea/Ballot-v0", split="heldout", agents=3), skip_render_check=True)


def _votes(env: BallotEnv, seed: int, choose) -> tuple[bool, float, list[str]]:
    obs, info = env.reset(seed=seed)
    seen = [obs]
    while True:
        pair = info["admissible_actions"]
        obs, reward, term, _, info = env.step(choose(len(seen) - 1, pair))
        assert not info["invalid"]
        seen.append(obs)
        if term:
            return bool(info["won"]), reward, seen


def test_deterministic_and_heldout_disjoint():
    a, b = BallotEnv(), BallotEnv()
    for seed in (0, 3, 987654321):
        assert _votes(a, seed, lambda j, p: p[j % 2]) == _votes(b, seed, lambda j, p: p[j % 2])
        assert a.reset(seed=seed)[1]["goal"] == b.reset(seed=seed)[1]["goal"]
    assert not set(CHORES["train"]) & set(CHORES["heldout"])
    chores = {"train": set(), "heldout": set()}
    for split, seen in chores.items():
        for seed in range(200):
            g = generate_game(split, seed)
            seen.add(g.chore)
            assert g.ballots == VOTES[:4]  # every member votes with its own two words, in every game and split
    assert chores["train"] == set(CHORES["train"]) and chores["heldout"] == set(CHORES["heldout"])
    words = [w for pair in VOTES for w in pair]
    assert len(set(words)) == len(words)  # no word is two members'


def test_the_words_never_appear_in_an_observation():
    """What a vote meant is private: no observation names a ballot's words."""
    env = BallotEnv()
    rng = random.Random(0)
    words = {w for pair in VOTES for w in pair}
    for seed in range(100):
        _won, _, seen = _votes(env, seed, lambda j, p: rng.choice(p))
        assert not any(re.search(rf"\b{w}\b", obs) for obs in seen for w in words)


def test_a_convention_wins_every_game_and_anything_but_exactly_one_loses():
    env = BallotEnv(split="heldout")
    for seed in range(100):
        won, reward, _ = _votes(env, seed, lambda j, p: p[0] if j == 0 else p[1])
        assert won and reward == 1.0
        assert env.reset(seed=seed)[1]["walkthrough"] == scripted(generate_game("heldout", seed).ballots)
        assert _votes(env, seed, lambda j, p: p[1])[:2] == (False, 0.0)  # nobody takes it on
        assert _votes(env, seed, lambda j, p: p[0] if j < 2 else p[1])[:2] == (False, 0.0)  # two do


def test_a_random_team_wins_n_over_2_to_the_n():
    env = BallotEnv()
    rng = random.Random(1)
    n = 4000
    won = sum(_votes(env, seed, lambda j, p: rng.choice(p))[0] for seed in range(n)) / n
    p = success(0.5, 4)
    assert abs(won - p) < 4 * math.sqrt(p * (1 - p) / n)  # 0.25 ± 0.027


def test_a_word_off_the_list_is_invalid_and_the_ballot_stays_open():
    env = BallotEnv()
    obs, _info = env.reset(seed=5)
    same, reward, term, _, inf = env.step("I volunteer")
    assert inf["invalid"] and same == obs and reward == 0.0 and not term and inf["ballot"] == 0
    assert env.step(VOTES[1][0])[4]["invalid"]  # the next member's word is not on this list


# -- the team task, played through the team rollout loop with scripted members ---------------------------------
class _CharTokenizer:
    """A stand-in tokenizer: the chat is its messages' text, one id per character (the prompts are readable)."""

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False):
        return "\n".join(m["content"] for m in messages)

    def __call__(self, text, add_special_tokens=False):
        return SimpleNamespace(input_ids=[ord(c) for c in text])


class _Members:
    """The team's 'model': each member answers by a rule of its index, its own list (the last one shown) and the
    prompt's text."""

    def __init__(self, rule):
        self.rule, self.active, self.prompts = rule, None, []

    def activate(self, agent):
        self.active = agent

    def generate(self, prompts, **kw):
        out = []
        for ids in prompts:
            text = "".join(map(chr, ids))
            self.prompts.append((self.active, text))
            listed = text.rsplit("Valid commands:\n", 1)[1].split("\n")
            pair = [line[2:] for line in listed if line.startswith("- ")]
            out.append(Generation([1], [0.0], self.rule(self.active, pair, text)))
        return out


def _play_team(rule, seeds, copies=4, split="train", router="round_robin", max_turns=4):
    task = get_team_task("ballot_volunteer")
    members = _Members(rule)
    builder = TeamPromptBuilder(_CharTokenizer(), context_messages=10, message_max_chars=300)
    col = TeamCollector(members, members, builder, task, get_router(router), RolloutSection(), max_turns=max_turns)
    with EnvPool("slea/Ballot-v0", len(seeds), copies, {"split": split}) as pool:
        episodes, _ = col.collect(pool, seeds)
    return episodes, members.prompts


def test_team_task_is_four_acting_members_on_ballot():
    task = get_team_task("ballot_volunteer")
    assert task.agents == ["ana", "ben", "cai", "dov"] and task.env_ids == ("slea/Ballot-v0",)
    assert all(r.acts for r in task.roles)
    # symmetric: the roles' prompts differ only in the member's name and its own two words
    assert len({r.system.replace(r.name.capitalize(), "X") for r in task.roles}) == 1
    def blind(text, words):
        return re.sub(rf"\b{words[0]}\b", "A", re.sub(rf"\b{words[1]}\b", "B", text))

    assert len({tuple((blind(u, w), blind(a, w)) for u, a in r.example) for r, w in zip(task.roles, VOTES)}) == 1
    # each member's examples list its own words and vote once for each position: no preference taught
    for role, words in zip(task.roles, VOTES):
        answers = [(user.rsplit("- ", 2)[-2].strip(), user.rsplit("- ", 1)[-1].split("\n")[0], a)
                   for user, a in role.example]
        assert {(first, second) for first, second, _ in answers} == {words}
        assert sorted(a == first for first, _, a in answers) == [False, True]


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_a_scripted_convention_team_wins_every_episode(split):
    episodes, _ = _play_team(lambda agent, pair, _: pair[0] if agent == 0 else pair[1], [0, 1, 2, 3], split=split)
    assert len(episodes) == 16
    for ep in episodes:
        assert ep.agents == [0, 1, 2, 3] and ep.trajectory.won and ep.team_return == 1.0


def test_a_random_team_is_near_chance_and_deterministic_under_seeds():
    def rule_from(seed):
        rng = random.Random(seed)
        return lambda agent, pair, _: rng.choice(pair)

    seeds = list(range(50))
    episodes, prompts = _play_team(rule_from(7), seeds, copies=8)
    won = sum(e.trajectory.won for e in episodes) / len(episodes)
    assert abs(won - 0.25) < 4 * math.sqrt(0.25 * 0.75 / len(episodes))  # 400 episodes: 0.25 ± 0.087
    again, _ = _play_team(rule_from(7), seeds, copies=8)
    assert [e.trajectory.won for e in again] == [e.trajectory.won for e in episodes]
    # a member's prompt lists its own two words only; another member's words appear only as what it said
    for agent, text in prompts:
        real = text.rsplit("Goal: ", 1)[1]  # the real turn, after the example exchanges
        transcript, listed = real.rsplit("Valid commands:\n", 1)
        assert [line[2:] for line in listed.splitlines() if line.startswith("- ")] == list(VOTES[agent])
        spoken = re.findall(r"^\[(?:ana|ben|cai|dov)\] (\w+)$", transcript, re.MULTILINE)
        assert len(spoken) == agent and all(w in VOTES[j] for j, w in enumerate(spoken))
        for j in range(agent):  # the word it did not say is nowhere: its position on j's list is unknowable
            unsaid = next(w for w in VOTES[j] if w != spoken[j])
            assert not re.search(rf"\b{unsaid}\b", real)


def test_retry_invalid_keeps_every_ballot_with_its_member():
    """With ``retry_invalid`` a member whose vote was refused votes again on its own ballot; round-robin would hand
    the open ballot (and the refused member's words) to the next member."""
    def rule(agent, pair, text):
        refused = text.rsplit("Goal: ", 1)[1].count("Invalid command")
        return "puppy" if agent == 1 and refused == 0 else (pair[0] if agent == 0 else pair[1])

    episodes, prompts = _play_team(rule, [0, 1], router="retry_invalid", max_turns=8)
    for ep in episodes:
        assert ep.agents == [0, 1, 1, 2, 3] and ep.trajectory.won
        assert [s.valid for s in ep.trajectory.steps] == [True, False, True, True, True]
    for agent, text in prompts:  # every prompt lists its own member's words
        listed = text.rsplit("Valid commands:\n", 1)[1]
        assert [line[2:] for line in listed.splitlines() if line.startswith("- ")] == list(VOTES[agent])
    rr, _ = _play_team(rule, [0, 1], router="round_robin", max_turns=8)
    assert all(ep.agents[:3] == [0, 1, 2] and not ep.trajectory.won for ep in rr)
