"""ScienceWorld state keys (``ScienceWorldEnv.state_key``): SLEA-RL's structurally equivalent states.

The recorded observations and goals below were played from ``slea/ScienceWorld-v0`` (gold paths of
find-living-thing, boil, chemistry-mix and test-conductivity, train and dev variations); the engine tests play
the real env and skip without the scienceworld package or Java, as tests/envs/test_scienceworld.py does.
"""

from __future__ import annotations

import importlib.util
import shutil

import pytest

from slea.envs import scienceworld as sw_mod
from slea.envs.scienceworld import scienceworld_goal, scienceworld_state_key

HAVE_ENGINE = importlib.util.find_spec("scienceworld") is not None and shutil.which("java") is not None

RED_BOX_GOAL = ("Your task is to find a(n) living thing. First, focus on the thing. Then, move it to the red box in the"
                " kitchen.")
GREEN_BOX_GOAL = RED_BOX_GOAL.replace("red box", "green box")  # variation 1 of the task
BOIL_WATER = ("Your task is to boil water. For compounds without a boiling point, combusting the substance is also"
              " acceptable. First, focus on the substance. Then, take actions that will cause it to change its state"
              " of matter.")
BOIL_ICE_CREAM = BOIL_WATER.replace("boil water", "boil ice cream")  # a dev variation
SMORES = ("Your task is to use chemistry to create the substance 'smores'. A recipe and some of the ingredients might be"
          " found near the kitchen. When you are done, focus on the smores.")
FOIL = ("Your task is to determine if aluminum foil is electrically conductive. The aluminum foil is located around the"
        " workshop. First, focus on the aluminum foil. If it is electrically conductive, place it in the red box. If it"
        " is electrically nonconductive, place it in the green box.")
OUTSIDE_TRAIN = (  # train variation 0 of find-living-thing
    "This outside location is called the outside. Here you see:\n\ta blue jay egg\n\ta butterfly egg\n\ta dove egg\n"
    "\ta fire pit (containing nothing)\n\ta fountain (containing a substance called water)\n\ta substance called air\n"
    "\ta substance called wood\n\tan axe\n\tthe agent\n\tthe ground\nYou also see:\n\tA door to the foundry (that is"
    " closed)\n\tA door to the greenhouse (that is closed)\n\tA door to the kitchen (that is open)"
)
OUTSIDE_DEV = (  # dev variation 150 of find-living-thing: other animals
    "This outside location is called the outside. Here you see:\n\ta baby beaver\n\ta fire pit (containing nothing)\n"
    "\ta fountain (containing a substance called water)\n\ta giant tortoise egg\n\ta parrot egg\n\ta substance called"
    " air\n\ta substance called wood\n\tan axe\n\tthe agent\n\tthe ground\nYou also see:\n\tA door to the foundry"
    " (that is closed)\n\tA door to the greenhouse (that is closed)\n\tA door to the kitchen (that is open)"
)
OUTSIDE_CLOSED = (  # dev variation 16 of chemistry-mix: the kitchen door is closed
    "This outside location is called the outside. Here you see:\n\ta fire pit (containing nothing)\n\ta fountain"
    " (containing nothing)\n\ta shovel\n\ta substance called air\n\ta substance called wood\n\tan axe\n\tthe agent\n"
    "\tthe ground\nYou also see:\n\tA door to the foundry (that is closed)\n\tA door to the greenhouse (that is"
    " closed)\n\tA door to the kitchen (that is closed)"
)
WORKSHOP_FOIL = (  # train variation 0 of test-conductivity
    "This room is called the workshop. In it, you see:\n\tA aluminum foil\n\ta green box (containing nothing)\n\ta red"
    " box (containing nothing)\n\ta red light bulb, which is off\n\ta substance called air\n\ta table. On the table is:"
    " a battery, a black wire, a blue wire, a green light bulb, which is off, a orange wire, a switch, which is off, a"
    " violet light bulb, which is off, a yellow light bulb, which is off.\n\ta ultra low temperature freezer. The ultra"
    " low temperature freezer door is closed.\n\tthe agent\nYou also see:\n\tA door to the hallway (that is open)"
)
RECORDED = [
    (OUTSIDE_TRAIN, RED_BOX_GOAL), (OUTSIDE_DEV, RED_BOX_GOAL), (OUTSIDE_CLOSED, SMORES), (WORKSHOP_FOIL, FOIL),
    ("You move the blue jay to the red box.", RED_BOX_GOAL), ("You move the parrot to the green box.", GREEN_BOX_GOAL),
    ("You focus on the water.", BOIL_WATER), ("You focus on the ice cream.", BOIL_ICE_CREAM),
    ("You focus on the blue jay egg.", RED_BOX_GOAL), ("The door is now open.", SMORES),
]


def test_goal_things_rooms_and_boxes():
    assert scienceworld_goal(BOIL_ICE_CREAM) == ("ice cream", "", [])
    assert scienceworld_goal(SMORES) == ("smores", "kitchen", [])
    assert scienceworld_goal(FOIL) == ("aluminum foil", "workshop", ["red box", "green box"])
    assert scienceworld_goal(RED_BOX_GOAL) == ("", "kitchen", ["red box"])  # "a(n) living thing" is a kind
    assert scienceworld_goal("Your task is to grow a cherry plant from seed. Seeds can be found in the living room."
                             " First, focus on a seed.") == ("cherry seed", "living room", [])
    assert scienceworld_goal("Your task is to find the animal with the longest life span.  The animals are in the"
                             " 'outside' location.  Focus on the animal with the longest life span.") == ("", "outside", [])


def test_states_differing_only_in_the_variation_share_a_key():
    train, dev = scienceworld_state_key(OUTSIDE_TRAIN, RED_BOX_GOAL), scienceworld_state_key(OUTSIDE_DEV, RED_BOX_GOAL)
    assert train == dev
    assert train.text == "in the outside | open doors: the goal's room"
    assert train.slots == {"goal room": "kitchen"}
    red = scienceworld_state_key("You move the blue jay to the red box.", RED_BOX_GOAL)
    green = scienceworld_state_key("You move the parrot to the green box.", GREEN_BOX_GOAL)
    assert red.text == green.text == "after: you move an object to the goal's box 1"
    assert red.slots == {"object 1": "blue jay", "goal box 1": "red box"}
    assert green.slots == {"object 1": "parrot", "goal box 1": "green box"}
    water = scienceworld_state_key("You focus on the water.", BOIL_WATER)
    ice_cream = scienceworld_state_key("You focus on the ice cream.", BOIL_ICE_CREAM)
    assert water.text == ice_cream.text == "after: you focus on the goal's object"
    assert (water.slots, ice_cream.slots) == ({"goal object": "water"}, {"goal object": "ice cream"})


def test_states_needing_other_actions_get_other_keys():
    assert scienceworld_state_key(OUTSIDE_CLOSED, SMORES).text == (
        "in the outside | no open door | the goal's object not in view"
    )
    foil = scienceworld_state_key(WORKSHOP_FOIL, FOIL)
    assert foil.text == (
        "in the goal's room | open doors: hallway | the goal's object in view | the goal's box 1 in view | the goal's"
        " box 2 in view"
    )
    assert foil.slots == {"goal object": "aluminum foil", "goal room": "workshop", "goal box 1": "red box",
                          "goal box 2": "green box"}
    # focusing on a thing the goal does not name is not focusing on the goal's object
    assert scienceworld_state_key("You focus on the blue jay egg.", RED_BOX_GOAL).text == "after: you focus on an object"
    assert len({scienceworld_state_key(o, g).text for o, g in RECORDED}) == len(RECORDED) - 3  # the three pairs above


def test_keys_are_short_and_slots_name_what_the_agent_sees():
    for obs, goal in RECORDED:
        k = scienceworld_state_key(obs, goal)
        assert 0 < len(k.text) < 200
        seen = f"{obs} {goal}".lower()
        assert all(name in seen for name in k.slots.values()), k.slots
        assert all(role.replace(" ", "").isalnum() and role == role.lower() for role in k.slots)


# -- the real env ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sw():
    if not HAVE_ENGINE:
        pytest.skip("needs the scienceworld package and Java >= 11")
    env = sw_mod.ScienceWorldEnv(tasks=["find-living-thing", "chemistry-mix"], split="dev", admissible=False)
    yield env
    env.close()


def test_every_info_carries_the_key_of_what_the_agent_sees(sw):
    for seed in (0, 1):
        obs, info = sw.reset(seed=seed)
        turns = [(obs, info)]
        for action in info["walkthrough"][:8]:
            obs, _, _, _, info = sw.step(action)
            turns.append((obs, info))
        for obs, info in turns:
            k = scienceworld_state_key(obs, info["goal"])
            assert (info["state_key"], info["state_slots"]) == (k.text, k.slots) and len(k.text) < 200
            seen = f"{obs} {info['goal']}".lower()
            assert all(name in seen for name in k.slots.values())


def test_the_key_never_reads_the_gold_path_or_the_score(sw, monkeypatch):
    obs, info = sw.reset(seed=0)
    before = sw.state_key(obs)
    monkeypatch.setattr(sw, "_walkthrough", ["focus on the wrong thing"])  # another gold path
    monkeypatch.setattr(sw, "_score", 50)
    monkeypatch.setattr(sw, "_engine", None)  # and no simulator to read from
    assert sw.state_key(obs) == before and before.text == info["state_key"]
