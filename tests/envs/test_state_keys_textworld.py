"""TextWorld state keys (``TextWorldEnv.state_key``): SLEA-RL's structurally equivalent states.

The recorded observations, goals and commands below were played from ``slea/TextWorld-v0`` with the default job's
task set (configs/default.yaml: train games 1000+, held-out games 5000+) and from ``treasure_hunter:15`` games (doors,
containers, supporters); the rest of the file plays the real env from the session's game cache.
"""

from __future__ import annotations

from slea.envs.textworld import textworld_state_key


def case(observation: str, goal: str, commands: list[str]) -> tuple[str, str, list[str]]:
    return observation, goal, commands


# (observation, goal, admissible commands), recorded from the real env
BAR = case(  # train game 10 (coin_collector:4)
    "-= Bar =-\nWell, here we are in the bar.\n\nThere is an unblocked exit to the east.\n\nThere is a coin on the floor.",
    "Hey, thanks for coming over to the TextWorld today, there is something I need you to do for me. First off, make an"
    " attempt to head west. And then, attempt to venture south. Then, go to the west. With that accomplished, pick-up"
    " the coin from the floor of the bar. Alright, thanks!",
    ["go east", "take coin"],
)
BEDCHAMBER = case(  # train game 13 (treasure_hunter:3)
    "-= Bedchamber =-\nYou arrive in a bedchamber. A typical kind of place. I guess you better just go and list"
    " everything you see here.\n\nYou need an unguarded exit? You should try going east.\n\nThere is a loaf of bread on"
    " the floor.",
    "You are now playing a exciting round of TextWorld! First step, head west. Once you manage that, retrieve the loaf"
    " of bread from the floor of the bedchamber. And once you've done that, you win!",
    ["go east", "take loaf of bread"],
)
CHAMBER = case(  # held-out game 3 (coin_collector:4)
    "-= Chamber =-\nWell, here we are in a chamber.\n\nThere is an exit to the east. Don't worry, it is unblocked.\n\n"
    "There is a coin on the floor.",
    "It's time to explore the amazing world of TextWorld! Your first objective is to try to move east. If you can"
    " succeed at that, move north. Okay, and then, take a trip west. Next, recover the coin from the floor of the"
    " chamber. Alright, thanks!",
    ["go east", "take coin"],
)
GARAGE = case(  # train game 13, the first room (the goal's object is elsewhere)
    "-= Garage =-\nWell how about that, you are in a place we're calling a garage.\n\nThere is an unguarded exit to the"
    " east. You don't like doors? Why not try going west, that entranceway is unguarded.",
    BEDCHAMBER[1],
    ["go east", "go west"],
)
LOUNGE = case(  # train game 13, another room
    "-= Lounge =-\nWell I'll be, you are in the place we're calling the lounge.\n\nThere is an exit to the north. Don't"
    " worry, it is unblocked. You need an unguarded exit? You should try going west.",
    BEDCHAMBER[1],
    ["go north", "go west"],
)
CHAMBER_NORTH = case(  # train game 2 (coin_collector:3): the goal's object is elsewhere
    "-= Chamber =-\nYou're now in a chamber. Okay, just remember what you're here to do, and everything will go"
    " great.\n\nYou need an unblocked exit? You should try going north.",
    "Get ready to pick stuff up and put it in places, because you've just entered TextWorld! Here is how to play!"
    " First off, if it's not too much trouble, I need you to move north. And then, move north. After that, recover"
    " the coin from the floor of the parlor. And if you do that, you're the winner!",
    ["go north"],
)
PANTRY = case(  # train game 6 (treasure_hunter:3)
    "-= Pantry =-\nYou've just sauntered into a pantry.\n\nThere is an exit to the north. Don't worry, it is unblocked."
    "\n\nThere is a passkey on the floor.",
    "I hope you're ready to go into rooms and interact with objects, because you've just entered TextWorld! Here is"
    " how to play! First of all, you could, like, move south. After that, retrieve the passkey from the floor of the"
    " pantry. Got that? Good!",
    ["go north", "take passkey"],
)
OFFICE = case(  # held-out game 6 (treasure_hunter:3): the goal's object and a distractor
    "-= Office =-\nYou arrive in an office. An ordinary kind of place. The room is well lit.\n\nYou need an unguarded"
    " exit? You should try going north.\n\nThere is a garlic clove and a keycard on the floor.",
    "I hope you're ready to go into rooms and interact with objects, because you've just entered TextWorld! Here is"
    " your task for today. First step, take a trip south. With that done, retrieve the garlic clove from the floor of"
    " the office. And if you do that, you're the winner!",
    ["go north", "take garlic clove", "take keycard"],
)
STUDIO = case(  # train game 5 (treasure_hunter:2)
    "-= Studio =-\nYou arrive in a studio. An usual kind of place.\n\nYou need an unblocked exit? You should try going"
    " east. You need an unblocked exit? You should try going north. There is an unblocked exit to the south.\n\nThere"
    " is a fly larva and a stapler on the floor.",
    "Get ready to pick stuff up and put it in places, because you've just entered TextWorld! Your task for today is to"
    " recover the fly larva from the floor of the studio.",
    ["go east", "go north", "go south", "take fly larva", "take stapler"],
)
KEYCARD_GOAL = (
    "Hey, thanks for coming over to the TextWorld today, there is something I need you to do for me. First of all,"
    " make an effort to venture north. After that, try to head north. Then, make an attempt to head east. Then, head"
    " north. With that over with, travel east. With that over with, recover the keycard from the rack. Got that? Good!"
)
LOCKER_ROOM = case(  # treasure_hunter:15: a closed container, an open door
    "-= Lounge =-\nYou're now in a lounge.\n\nYou can see a closed locker, which looks usual, close by.\n\nThere is an"
    " open gateway leading east. You need an unblocked exit? You should try going south. You don't like doors? Why not"
    " try going west, that entranceway is unblocked.",
    KEYCARD_GOAL,
    ["close gateway", "go east", "go south", "go west", "open locker"],
)
LOCKER_OPENED = case("You open the locker.", KEYCARD_GOAL,
                     ["close gateway", "close locker", "go east", "go south", "go west"])
CLOSET = case(  # treasure_hunter:15: the goal's object on the supporter the goal names
    "-= Closet =-\nWell, here we are in the closet.\n\nYou make out a closed toolbox, which looks ordinary, nearby. Oh,"
    " great. Here's a rack. You see a keycard on the rack.\n\nThere is an open gateway leading west. There is an"
    " unblocked exit to the south.",
    KEYCARD_GOAL,
    ["close gateway", "go south", "go west", "open toolbox", "take keycard from rack"],
)
WON = case("You pick up the coin from the ground.\n\nYour score has just gone up by one point.\n\n*** The End ***\n\n"
       "You scored 1 out of a possible 1.", CHAMBER[1], ["drop coin", "go east"])
LOST = case("You pick up the stapler from the ground.\n\n*** You lost! ***\n\nYou scored 0 out of a possible 1.",
            STUDIO[1], ["drop stapler", "go east", "go north", "go south", "take fly larva"])


def key(case):
    return textworld_state_key(*case)


def test_rooms_differing_only_in_names_and_filler_share_a_key():
    bar, bedchamber, chamber = key(BAR), key(BEDCHAMBER), key(CHAMBER)
    assert bar.text == bedchamber.text == chamber.text == (
        "a room (the goal's room) | exits east | the goal's object on the floor"
    )
    assert bar.slots == {"goal object": "coin", "goal room": "bar"}
    assert bedchamber.slots == {"goal object": "loaf of bread", "goal room": "bedchamber"}
    assert key(GARAGE).text == key(GARAGE[:1] + CHAMBER[1:2] + GARAGE[2:]).text  # another game's goal
    assert key(PANTRY).text == "a room (the goal's room) | exits north | the goal's object on the floor"


def test_rooms_differing_in_exits_objects_or_the_goal_get_different_keys():
    assert key(GARAGE).text == "a room | exits east, west | the goal's object not in view"
    assert key(LOUNGE).text == "a room | exits north, west | the goal's object not in view"  # exits differ
    assert key(CHAMBER_NORTH).text == "a room | exits north | the goal's object not in view"  # the pantry's exits
    office = key(OFFICE)  # one more object than the pantry, same exits
    assert office.text == "a room (the goal's room) | exits north | the goal's object on the floor | 1 other object"
    assert office.slots == {"goal object": "garlic clove", "other object 1": "keycard", "goal room": "office"}
    assert key(STUDIO).text == (
        "a room (the goal's room) | exits north, south, east | the goal's object on the floor | 1 other object"
    )


def test_doors_containers_and_supporters():
    room = key(LOCKER_ROOM)
    assert room.text == (
        "a room | exits south, east (open door), west | the goal's object not in view | 1 closed container"
    )
    assert room.slots == {"goal object": "keycard", "door 1": "gateway", "container 1": "locker"}
    closed_door = LOCKER_ROOM[0].replace("an open gateway", "a closed gateway")
    assert "east (closed door)" in key((closed_door, KEYCARD_GOAL, ["go south", "go west", "open gateway",
                                                                      "open locker"])).text
    opened = key(LOCKER_OPENED)  # feedback: no room text; exits from the commands, the door by its noun
    assert opened.text == (
        "after: you open a container | exits south, east, west | an open door | the goal's object not in view"
        " | 1 open container"
    )
    assert opened.slots["container 1"] == "locker"
    closet = key(CLOSET)
    assert closet.text == (
        "a room | exits south, west (open door) | the goal's object on the goal's place | the goal's place: a"
        " supporter | 1 closed container"
    )
    assert closet.slots == {"goal object": "keycard", "goal place": "rack", "door 1": "gateway", "container 1": "toolbox"}


def test_game_over_feedback():
    assert key(WON).text == "after: you pick up the goal's object from the ground | the game is over: won"
    lost = key(LOST)
    assert lost.text == "after: you pick up a carried object from the ground | the game is over: lost"
    assert lost.slots == {"carried object 1": "stapler"}


def test_keys_are_short_and_slots_name_what_the_agent_sees():
    for obs, goal, commands in (BAR, BEDCHAMBER, CHAMBER, GARAGE, LOUNGE, CHAMBER_NORTH, PANTRY, OFFICE, STUDIO, LOCKER_ROOM,
                                LOCKER_OPENED, CLOSET, WON, LOST):
        k = textworld_state_key(obs, goal, commands)
        assert 0 < len(k.text) < 200
        seen = " ".join([obs, goal, *commands]).lower()
        assert all(name in seen for name in k.slots.values()), k.slots
        assert all(role.replace(" ", "").isalnum() and role == role.lower() for role in k.slots)
        assert textworld_state_key(obs, goal, list(reversed(commands))) == k  # command order does not matter


# -- the real env (the fixtures skip without textworld) ---------------------------------------------------------


def play(env, seed):
    """Reset game ``seed`` and play its first admissible commands until the game ends: (obs, info) per turn."""
    obs, info = env.reset(seed=seed)
    turns = [(obs, info)]
    for _ in range(4):
        obs, _, done, _, info = env.step(info["admissible_actions"][0])
        turns.append((obs, info))
        if done:
            break
    return turns


def test_every_info_carries_the_key_of_what_the_agent_sees(tw_env):
    for seed in (0, 1):
        for obs, info in play(tw_env, seed):
            k = textworld_state_key(obs, info["goal"], info["admissible_actions"])
            assert (info["state_key"], info["state_slots"]) == (k.text, k.slots)
            seen = " ".join([obs, info["goal"], *info["admissible_actions"]]).lower()
            assert all(name in seen for name in info["state_slots"].values())


def test_two_games_rooms_of_one_structure_share_a_key(tw_cache):
    """Game 0 of the train split and game 0 of the held-out split (both coin_collector:1): other rooms, other
    filler, one key."""
    from slea.envs import make

    keys = []
    for split in ("train", "heldout"):
        env = make("slea/TextWorld-v0", tasks=tw_cache["tasks"], split=split, num_games=2 if split == "train" else 1,
                   cache_dir=tw_cache["dir"])
        obs, info = env.reset(seed=0)
        keys.append((obs, info["state_key"], info["state_slots"]))
        env.close()
    (train_obs, train_key, train_slots), (held_obs, held_key, held_slots) = keys
    assert train_obs != held_obs and train_key == held_key
    assert train_key == "a room (the goal's room) | no exits | the goal's object on the floor"
    assert train_slots["goal object"] == held_slots["goal object"] == "coin"
    assert train_slots["goal room"] != held_slots["goal room"]


def test_the_key_never_reads_the_walkthrough_score_or_engine(tw_env, monkeypatch):
    obs, info = tw_env.reset(seed=1)
    before = tw_env.state_key(obs)
    hidden = {"_walkthrough": ["go north", "take something else"], "_score": 0.5, "_max_score": 7.0, "_won": True,
              "_tw": None}  # another answer and score, and no engine to read from
    for name, value in hidden.items():
        monkeypatch.setattr(tw_env, name, value)
    assert tw_env.state_key(obs) == before and before.text == info["state_key"]
