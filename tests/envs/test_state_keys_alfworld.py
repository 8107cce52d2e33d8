"""ALFWorld state keys (``ALFWorldEnv.state_key``, one for official and generated games): SLEA-RL's structurally
equivalent states.

The recorded observations, goals and commands below were played from ``slea/ALFWorld-Gen-v0`` (train games 0, 4,
5, 10, 11 and held-out game 5); the rest of the file plays the real env: one generated game per task type in each
of two splits, and every registered ALFWorld id (the official one on generated games laid out as the official set).
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Any

import pytest

import slea.envs  # noqa: F401  (registers the families)
from slea.envs import alfworld as alf
from slea.envs import make, registered
from slea.envs.alfworld import alfworld_goal, alfworld_state_key

HAVE_ENGINE = all(importlib.util.find_spec(m) is not None for m in ("alfworld", "textworld", "fast_downward"))
ORDER = ["pick", "look", "clean", "heat", "cool", "pick_two"]


def case(observation: str, goal: str, commands: list[str]) -> tuple[str, str, list[str]]:
    return observation, goal, commands


# (observation, goal, admissible commands), recorded from the real env
KEYCHAIN_SEEN = case(  # train game 11
    "You arrive at sidetable 1. On the sidetable 1, you see a keychain 1, and a vase 1.",
    "find two keychain and put them in drawer",
    ["examine sidetable 1", "go to coffeetable 1", "go to drawer 1", "go to dresser 1", "go to garbagecan 1",
     "go to shelf 1", "go to sofa 1", "go to tvstand 1", "inventory", "look", "take keychain 1 from sidetable 1",
     "take vase 1 from sidetable 1"],
)
SOAPBOTTLE_SEEN = case(  # held-out game 5
    "You arrive at garbagecan 1. On the garbagecan 1, you see a soapbottle 3.",
    "find two soapbottle and put them in cabinet",
    ["examine garbagecan 1", "go to cabinet 1", "go to cabinet 2", "go to coffeemachine 1", "go to countertop 1",
     "go to diningtable 1", "go to drawer 1", "go to drawer 2", "go to drawer 3", "go to fridge 1",
     "go to microwave 1", "go to shelf 1", "go to shelf 2", "go to sinkbasin 1", "go to stoveburner 1",
     "go to toaster 1", "inventory", "look", "take soapbottle 3 from garbagecan 1"],
)
NEWSPAPER_SEEN = case(  # train game 5: no keychain here
    "You arrive at sidetable 1. On the sidetable 1, you see a newspaper 3.",
    "put two keychain in sofa",
    ["examine sidetable 1", "go to armchair 1", "go to cabinet 1", "go to coffeetable 1", "go to drawer 1",
     "go to dresser 1", "go to garbagecan 1", "go to ottoman 1", "go to shelf 1", "go to sidetable 2",
     "go to sofa 1", "go to tvstand 1", "inventory", "look", "take newspaper 3 from sidetable 1"],
)
COOL_MUG = case(  # train game 4, holding the mug at the fridge
    "You arrive at fridge 1. The fridge 1 is closed.",
    "cool some mug and put it in countertop",
    ["cool mug 1 with fridge 1", "examine fridge 1", "examine mug 1", "go to cabinet 1", "go to cabinet 2",
     "go to cabinet 3", "go to coffeemachine 1", "go to countertop 1", "go to drawer 1", "go to garbagecan 1",
     "go to microwave 1", "go to shelf 1", "go to sinkbasin 1", "go to stoveburner 1", "go to stoveburner 2",
     "go to stoveburner 3", "inventory", "look", "open fridge 1"],
)
COOL_BREAD = case(  # train game 10: the other template of the cool task
    "You arrive at fridge 1. The fridge 1 is closed.",
    "put a cool bread in countertop",
    ["cool bread 2 with fridge 1", "examine bread 2", "examine fridge 1", "go to cabinet 1", "go to cabinet 2",
     "go to cabinet 3", "go to coffeemachine 1", "go to countertop 1", "go to diningtable 1", "go to drawer 1",
     "go to drawer 2", "go to drawer 3", "go to garbagecan 1", "go to microwave 1", "go to sinkbasin 1",
     "go to stoveburner 1", "inventory", "look", "open fridge 1"],
)
CD_AT_DRAWER = case(  # train game 0, holding the cd at the closed drawer the goal names
    "You arrive at drawer 1. The drawer 1 is closed.",
    "put some cd on drawer",
    ["examine cd 1", "examine drawer 1", "go to armchair 1", "go to bed 1", "go to desk 1", "go to drawer 2",
     "go to garbagecan 1", "go to laundryhamper 1", "go to safe 1", "go to shelf 1", "go to shelf 2",
     "go to shelf 3", "go to sidetable 1", "go to sidetable 2", "inventory", "look", "open drawer 1"],
)
DRAWER_OPENED = case(  # train game 0, the next step
    "You open the drawer 1. The drawer 1 is open. In it, you see nothing.",
    "put some cd on drawer",
    ["close drawer 1", "examine cd 1", "examine drawer 1", "go to armchair 1", "go to bed 1", "go to desk 1",
     "go to drawer 2", "go to garbagecan 1", "go to laundryhamper 1", "go to safe 1", "go to shelf 1",
     "go to shelf 2", "go to shelf 3", "go to sidetable 1", "go to sidetable 2", "inventory", "look",
     "move cd 1 to drawer 1"],
)
KEYCHAIN_AT_DRAWER = case(  # train game 5: a closed drawer the goal does not name, holding nothing
    "You arrive at drawer 1. The drawer 1 is closed.",
    "put two keychain in sofa",
    ["examine drawer 1", "go to armchair 1", "go to cabinet 1", "go to coffeetable 1", "go to dresser 1",
     "go to garbagecan 1", "go to ottoman 1", "go to shelf 1", "go to sidetable 1", "go to sidetable 2",
     "go to sofa 1", "go to tvstand 1", "inventory", "look", "open drawer 1"],
)
RECORDED = [KEYCHAIN_SEEN, SOAPBOTTLE_SEEN, NEWSPAPER_SEEN, COOL_MUG, COOL_BREAD, CD_AT_DRAWER, DRAWER_OPENED,
            KEYCHAIN_AT_DRAWER]


def key(c):
    return alfworld_state_key(*c)


def test_goal_templates():
    assert alfworld_goal("put some cd on drawer") == ("pick", "cd", "drawer")
    assert alfworld_goal("put a candle in cabinet") == ("pick", "candle", "cabinet")
    assert alfworld_goal("put a clean soapbar in cabinet") == ("clean", "soapbar", "cabinet")
    assert alfworld_goal("clean some ladle and put it in countertop") == ("clean", "ladle", "countertop")
    assert alfworld_goal("put a hot tomato in fridge") == ("heat", "tomato", "fridge")
    assert alfworld_goal("heat some mug and put it in fridge") == ("heat", "mug", "fridge")
    assert alfworld_goal("put a cool bread in countertop") == ("cool", "bread", "countertop")
    assert alfworld_goal("put two keychain in sofa") == ("pick two", "keychain", "sofa")
    assert alfworld_goal("find two soapbottle and put them in cabinet") == ("pick two", "soapbottle", "cabinet")
    assert alfworld_goal("look at watch under the desklamp") == ("look", "watch", "desklamp")
    assert alfworld_goal("examine the book with the desklamp") == ("look", "book", "desklamp")
    assert alfworld_goal("dance") == ("", "", "")


def test_states_differing_only_in_names_share_a_key():
    keychain, soapbottle = key(KEYCHAIN_SEEN), key(SOAPBOTTLE_SEEN)
    assert keychain.text == soapbottle.text == (
        "pick two: you arrive at another receptacle | the goal's object in view | carrying nothing"
    )
    assert keychain.slots == {"receptacle": "sidetable 1", "goal object": "keychain 1"}
    assert soapbottle.slots == {"receptacle": "garbagecan 1", "goal object": "soapbottle 3"}
    mug, bread = key(COOL_MUG), key(COOL_BREAD)  # two templates of one task, other objects
    assert mug.text == bread.text == "cool: you arrive at the task's appliance | closed | carrying the goal's object"
    assert mug.slots == {"appliance": "fridge 1", "goal object": "mug 1"}
    assert bread.slots == {"appliance": "fridge 1", "goal object": "bread 2"}


def test_states_needing_other_actions_get_other_keys():
    assert key(NEWSPAPER_SEEN).text == (
        "pick two: you arrive at another receptacle | the goal's object not in view | carrying nothing"
    )
    assert key(CD_AT_DRAWER).text == "pick: you arrive at the goal's receptacle | closed | carrying the goal's object"
    assert key(KEYCHAIN_AT_DRAWER).text == "pick two: you arrive at another receptacle | closed | carrying nothing"
    opened = key(DRAWER_OPENED)
    assert opened.text == (
        "pick: you open the goal's receptacle | open | the goal's object not in view | carrying the goal's object"
    )
    assert opened.slots == {"goal receptacle": "drawer 1", "goal object": "cd 1"}
    texts = {key(c).text for c in RECORDED}
    assert len(texts) == len(RECORDED) - 2  # only the two pairs above share a key


def test_keys_are_short_and_slots_name_what_the_agent_sees():
    for obs, goal, commands in RECORDED:
        k = alfworld_state_key(obs, goal, commands)
        assert 0 < len(k.text) < 200
        seen = " ".join([obs, goal, *commands]).lower()
        assert all(name in seen for name in k.slots.values()) and k.slots
        assert alfworld_state_key(obs, goal, list(reversed(commands))) == k


# -- the real env -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def games(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not HAVE_ENGINE:
        pytest.skip("needs the alfworld extra (alfworld, textworld[pddl])")
    cache: Path = tmp_path_factory.mktemp("alf-keys")
    return {"dir": cache, "train": alf.prepare_games(ORDER, "train", 6, cache),
            "heldout": alf.prepare_games(ORDER, "heldout", 6, cache)}


def play(env: Any, seed: int) -> list[tuple[str, dict[str, Any]]]:
    """The expert's walkthrough of game ``seed``: (observation, info) per turn."""
    obs, info = env.reset(seed=seed)
    turns = [(obs, info)]
    for command in info["walkthrough"]:
        obs, _, _, _, info = env.step(command)
        turns.append((obs, info))
    return turns


def test_every_info_carries_the_key_of_what_the_agent_sees(games):
    env = make("slea/ALFWorld-Gen-v0", tasks=ORDER, num_games=6, cache_dir=games["dir"])
    try:
        for seed in range(6):
            turns = play(env, seed)
            assert turns[-1][1]["won"]
            for obs, info in turns:
                k = alfworld_state_key(obs, info["goal"], info["admissible_actions"])
                assert (info["state_key"], info["state_slots"]) == (k.text, k.slots) and len(k.text) < 200
                seen = " ".join([obs, info["goal"], *info["admissible_actions"]]).lower()
                assert all(name in seen for name in k.slots.values())
    finally:
        env.close()


def test_two_games_of_one_task_share_start_keys(games):
    """Game ``i`` of the train and of the held-out split have the same task type in other rooms: other
    observations, the same start key."""
    keys = {}
    for split in ("train", "heldout"):
        env = make("slea/ALFWorld-Gen-v0", tasks=ORDER, split=split, num_games=6, cache_dir=games["dir"])
        keys[split] = [env.reset(seed=i) for i in range(6)]
        env.close()
    for (train_obs, train), (held_obs, held) in zip(keys["train"], keys["heldout"], strict=True):
        assert train_obs != held_obs and train["state_key"] == held["state_key"]
    assert keys["train"][0][1]["state_key"] == (
        "pick: you are in the middle of a room | the goal's receptacle in view | carrying nothing"
    )


def test_the_key_never_reads_the_walkthrough_or_the_expert(games):
    env = make("slea/ALFWorld-Gen-v0", tasks=ORDER, num_games=6, cache_dir=games["dir"])
    obs, info = env.reset(seed=2)
    obs, *_ = env.step(info["walkthrough"][1])
    before = env.state_key(obs)
    env._walkthrough, env._expert_action = ["go to nowhere 9"], "go to nowhere 9"  # the hidden answer changes
    env.close()  # and no engine to read from
    assert env._engine is None and env.state_key(obs) == before


def test_every_registered_alfworld_id_gives_keys(games, tmp_path, monkeypatch):
    root = tmp_path / "alfworld_data" / "json_2.1.1"
    shutil.copytree(games["heldout"][0].parent, root / "valid_unseen" / "pick_and_place_simple-Cd-None-Drawer-1" / "t1")
    (root / "train").mkdir()
    monkeypatch.setattr(alf.Path, "home", lambda: tmp_path / "home")  # no official set in ~/.cache/alfworld
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    kwargs = {"slea/ALFWorld-Official-v0": {"data_path": root.parent, "split": "heldout"}}
    ids = sorted(i for i, spec in registered().items() if spec.family == "alfworld")
    assert ids == ["slea/ALFWorld-Gen-v0", "slea/ALFWorld-Official-v0", "slea/ALFWorld-v0"]
    for env_id in ids:
        env = make(env_id, **kwargs.get(env_id, {"cache_dir": games["dir"], "split": "heldout", "num_games": 1}))
        try:
            obs, info = env.reset(seed=0)
            assert info["state_key"] == alfworld_state_key(obs, info["goal"], info["admissible_actions"]).text
            assert info["state_key"].startswith("pick: you are in the middle of a room")
        finally:
            env.close()
