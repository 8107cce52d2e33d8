"""Text Sokoban: generated rooms are solvable, deterministic, and the env follows the contract."""

from __future__ import annotations

import gymnasium as gym
import pytest

import slea.envs  # noqa: F401  (registers slea/Sokoban-v0)
from slea.envs import make
from slea.envs.sokoban import (
    ACTIONS,
    LEGEND,
    SokobanEnv,
    deadlocked,
    generate_room,
    parse_level,
    replay,
    solve,
)


@pytest.mark.parametrize("seed", range(51))
def test_every_room_is_solved_by_its_walkthrough(seed):
    env = SokobanEnv()
    _, info = env.reset(seed=seed)
    walkthrough = info["walkthrough"]
    assert walkthrough and not info["won"]
    rewards = []
    for i, action in enumerate(walkthrough):
        _obs, reward, terminated, _truncated, info = env.step(action)
        assert info["invalid"] is False
        rewards.append(reward)
        assert terminated == (i == len(walkthrough) - 1)
    assert info["won"] is True and rewards[-1] == 1.0 and sum(rewards) == 1.0
    # BFS gives a shortest solution: nothing shorter exists.
    room = generate_room(env.room_seed(seed))
    assert len(solve(room)) == len(walkthrough)


def test_bigger_rooms_are_solvable():
    for seed in range(10):
        room = generate_room(seed, (7, 7), 2)
        assert len(room.boxes) == 2 and len(room.targets) == 2
        assert replay(room, room.solution)[1] == room.targets


def test_determinism_same_seed_same_room_and_observation():
    a, b = SokobanEnv(), SokobanEnv()
    for seed in (0, 7, 123):
        oa, ia = a.reset(seed=seed)
        ob, ib = b.reset(seed=seed)
        assert oa == ob and ia == ib
        for action in ("up", "left", "down", "right", "up"):
            ra, rb = a.step(action), b.step(action)
            assert ra == rb
    boards = {SokobanEnv().reset(seed=s)[0] for s in range(20)}
    assert len(boards) > 15  # different seeds give different rooms


def test_observation_is_the_board_and_a_stable_anchor():
    env = SokobanEnv()
    obs, info = env.reset(seed=4)
    assert "@" in obs or "+" in obs
    # The legend and the moves are the env's instructions, not part of every observation.
    assert "Legend" not in obs and LEGEND in env.instructions.system
    assert obs.splitlines()[0] == "#" * 6  # the board's top border comes first
    assert info["admissible_actions"] == list(ACTIONS) and info["task_type"] == "sokoban"
    assert info["goal"]
    # Leaving and coming back gives the same anchor (no move counter in the text).
    for first, back in (("up", "down"), ("down", "up"), ("left", "right"), ("right", "left")):
        state = env.get_state()
        _o1, _, _, _, i1 = env.step(first)
        if i1["feedback"].startswith("You move"):
            o2, *_ = env.step(back)
            assert o2 == obs
            break
        env.set_state(state)


def test_splits_are_disjoint_and_num_games_wraps():
    train, held = SokobanEnv(split="train"), SokobanEnv(split="heldout")
    assert {train.room_seed(k) for k in range(1000)}.isdisjoint(held.room_seed(k) for k in range(1000))
    env = SokobanEnv(num_games=5)
    assert env.reset(seed=2)[0] == env.reset(seed=7)[0] == env.reset(options={"game": 12})[0]


@pytest.mark.parametrize("bad", ["", "xyzzy", "x" * 10_000, "up up", "take coin", "\n\n"])
def test_invalid_actions(bad):
    env = SokobanEnv()
    obs, _ = env.reset(seed=1)
    obs2, reward, terminated, truncated, info = env.step(bad)
    assert info["invalid"] is True and obs2 == obs and reward == 0.0 and not terminated and not truncated


def test_action_normalisation_and_wall_bump():
    env = SokobanEnv()
    env.reset(options={"level": "#####\n#@$.#\n#####"})
    _, reward, terminated, _, info = env.step("  [UP]. ")
    assert info["invalid"] is False and info["feedback"] == "You bump into a wall." and reward == 0.0
    _obs, reward, terminated, _, info = env.step("east")
    assert info["won"] and terminated and reward == 1.0
    _, _, _, _, info = env.step("left")  # the episode is over
    assert info["invalid"] is True


def test_level_parsing_deadlock_and_shaped_rewards():
    level = "######\n#@$_.#\n#____#\n######"
    room = parse_level(level)
    assert room.solution and replay(room, room.solution)[1] == room.targets
    env = SokobanEnv(step_penalty=0.1, box_reward=0.5, terminate_on_deadlock=True)
    env.reset(options={"level": level})
    _, reward, _, _, _ = env.step("right")
    assert reward == pytest.approx(-0.1)
    _, reward, terminated, _, info = env.step("right")
    assert reward == pytest.approx(1.0 + 0.5 - 0.1) and terminated and info["won"]
    corner = parse_level("#####\n#$__#\n#_@.#\n#####")
    assert deadlocked(corner, corner.boxes)
    env.reset(options={"level": "#####\n#__.#\n#_$@#\n#___#\n#####"})
    _, _, terminated, _, info = env.step("left")  # box pushed to the left wall, not a corner
    assert not info["lost"] and not terminated
    env.step("down")
    env.step("left")
    _, _, terminated, _, info = env.step("up")  # box into the top-left corner: deadlock
    assert info["lost"] and terminated and not info["won"]


def test_get_state_set_state_round_trip():
    env = SokobanEnv()
    _obs, info = env.reset(seed=11)
    walk = info["walkthrough"]
    env.step(walk[0])
    snap = env.get_state()
    obs_at_snap = env.render()
    for action in walk[1:]:
        env.step(action)
    assert env.get_state()["won"]
    env.set_state(snap)
    assert env.render() == obs_at_snap
    other = SokobanEnv()
    other.reset(seed=0)
    other.set_state(snap)
    result = None
    for action in walk[1:]:
        result = other.step(action)
    assert result is not None and result[4]["won"] and result[1] == 1.0


def test_gymnasium_make_after_import():
    env = gym.make("slea/Sokoban-v0")
    obs, info = env.reset(seed=3)
    assert "$" in obs and info["walkthrough"]
    for action in info["walkthrough"]:
        obs, reward, terminated, _truncated, info = env.step(action)
    assert terminated and reward == 1.0
    two = make("slea/Sokoban-2box-v0")
    _, info = two.reset(seed=0)
    assert info["num_boxes"] == 2
