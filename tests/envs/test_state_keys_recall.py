"""Recall's state keys: one key per chamber type across games and splits (names and objects dropped), slots that
name the warden and the object of the observation, and nothing read from the hidden right gestures."""

from __future__ import annotations

import slea.envs  # noqa: F401  (registers slea/Recall-v0)
from slea.envs import make
from slea.envs import recall as rc
from slea.envs.recall import CHAMBERS, GESTURES, RIGHT, WIN_TEXT, chamber_key, generate_game


def _chamber_rows(split: str, games: int) -> list[tuple[str, str, dict[str, str], str]]:
    """(observation, key, slots, true chamber type) of every chamber of ``games`` games, walked with the expert."""
    env = make("slea/Recall-v0", split=split)
    rows = []
    for game in range(games):
        obs, info = env.reset(seed=game)
        for gesture in info["walkthrough"]:
            rows.append((obs, info["state_key"], info["state_slots"], info["kind"]))
            obs, _, _, _, info = env.step(gesture)
    return rows


def test_one_key_per_chamber_type_across_games_and_splits():
    rows = _chamber_rows("train", 12) + _chamber_rows("heldout", 12)
    key_of: dict[str, set[str]] = {}
    for _, key, _, kind in rows:
        key_of.setdefault(kind, set()).add(key)
    assert set(key_of) == {k for k, _ in CHAMBERS}  # every type was visited
    assert all(len(keys) == 1 for keys in key_of.values()), key_of  # names and objects dropped
    assert len({next(iter(keys)) for keys in key_of.values()}) == len(CHAMBERS)  # types kept apart
    # two observations of one type that differ in names: different texts, the same key, other slots
    a, b = next((a, b) for a in rows for b in rows if a[3] == b[3] and a[0] != b[0])
    assert a[1] == b[1] and a[2] != b[2]


def test_slots_name_the_warden_and_the_object_of_the_observation():
    for obs, key, slots, kind in _chamber_rows("heldout", 6):
        assert key == f"{kind} chamber: the warden and the object"
        assert set(slots) == {"warden", "object"}
        assert obs.count(slots["warden"]) == 1 and slots["object"] in obs
        assert obs.replace(slots["warden"], "").replace(slots["object"], "") == (
            dict(CHAMBERS)[kind].replace("{name}", "").replace("{thing}", ""))


def test_the_end_states_have_their_own_keys():
    env = make("slea/Recall-v0")
    _, info = env.reset(seed=3)
    wrong = next(g for g in GESTURES if g != info["walkthrough"][0])
    _, _, done, _, info = env.step(wrong)
    assert done and info["state_key"] == "the warden refused the gesture: the attempt is over"
    assert info["state_slots"] == {"warden": env.get_state()["rooms"][0].name}
    env.reset(seed=3)
    for gesture in info["walkthrough"]:
        _, _, done, _, info = env.step(gesture)
    assert done and info["won"] and info["state_key"] == "the vault is crossed" == chamber_key(WIN_TEXT).text
    assert chamber_key("A bare antechamber with whitewashed walls.") is None


def test_the_key_never_reads_the_right_gestures_or_the_hidden_rooms(monkeypatch):
    env = make("slea/Recall-v0")
    obs, info = env.reset(seed=5)
    before = env.state_key(obs)
    assert before is not None and before.text == info["state_key"]
    # another game's rooms behind the same observation, and another table of right gestures
    env._rooms = generate_game("train", 6)
    assert env._rooms[0].kind != info["kind"]
    monkeypatch.setattr(rc, "RIGHT", {k: GESTURES[(GESTURES.index(g) + 1) % len(GESTURES)] for k, g in RIGHT.items()})
    assert env.state_key(obs) == before
