"""Ballot's state keys: one key per open ballot across chores and splits, the voter's words and the chore as slots
from the list and the goal, and nothing read from the votes already cast."""

from __future__ import annotations

import slea.envs  # noqa: F401  (registers slea/Ballot-v0)
from slea.envs import make


def _keys_of_a_game(split: str, game: int, agents: int = 4) -> list[tuple[str, dict[str, str], dict]]:
    """(key, slots, info) of every state of a game voted by the convention (member 1 takes the chore on)."""
    env = make("slea/Ballot-v0", split=split, agents=agents)
    _, info = env.reset(seed=game)
    rows = [(info["state_key"], info["state_slots"], info)]
    for word in info["walkthrough"]:
        _, _, _, _, info = env.step(word)
        rows.append((info["state_key"], info["state_slots"], info))
    return rows


def test_the_same_ballot_of_games_with_other_chores_has_one_key():
    a, b = _keys_of_a_game("train", 1), _keys_of_a_game("heldout", 2)
    assert a[0][2]["goal"] != b[0][2]["goal"]  # other chores (held-out chores are disjoint)
    assert [k for k, _, _ in a] == [k for k, _, _ in b]
    assert a[0][1]["chore"] != b[0][1]["chore"]
    assert [k for k, _, _ in a] == [
        "ballot 1 of 4: the take word or the leave word", "ballot 2 of 4: the take word or the leave word",
        "ballot 3 of 4: the take word or the leave word", "ballot 4 of 4: the take word or the leave word",
        "all 4 ballots are counted"]
    assert _keys_of_a_game("train", 1, agents=3)[0][0] == "ballot 1 of 3: the take word or the leave word"


def test_slots_are_the_voters_own_words_and_the_goals_chore():
    for key, slots, info in _keys_of_a_game("train", 4):
        assert slots["chore"] in info["goal"]
        if key.startswith("ballot"):
            assert [slots["take word"], slots["leave word"]] == info["admissible_actions"]
        else:
            assert set(slots) == {"chore"} and info["admissible_actions"] == []


def test_the_key_never_reads_the_votes_cast_or_the_count():
    env = make("slea/Ballot-v0")
    _, info = env.reset(seed=0)
    obs, _, _, _, info = env.step(info["admissible_actions"][0])  # member 1 takes it on
    shown = (obs, info["goal"], info["admissible_actions"])
    before = env.state_key(obs)
    env._votes, env._takes = ["blue"], 0  # as if member 1 had left it
    assert (env._last_obs, env._goal, env._admissible) == shown
    assert env.state_key(obs) == before and before is not None
    assert env.state_key("a text of another game") is None
