"""The env contract and registry in slea.envs.base."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import slea.envs  # noqa: F401  (registers the families)
from slea.envs import base
from slea.envs.base import MissingExtraError, TextEnv, make, register, registered


class FakeEnv(TextEnv):
    task_type = "fake"

    def __init__(self, greeting: str = "hello") -> None:
        super().__init__()
        self.greeting = greeting

    def _reset(self, seed: int | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self._goal = "say ok"
        self._admissible = ["ok", "boom"]
        return f"{self.greeting} {seed}", {}

    def _step(self, action: str):
        if action == "boom":
            raise RuntimeError("engine crashed")
        return "fine", 1.0, True, False, {"won": True}

    def _info_defaults(self) -> dict[str, Any]:
        return {"lost": False}


@pytest.fixture
def fake_ids():
    ids: list[str] = []
    yield ids
    for id_ in ids:
        base._REGISTRY.pop(id_, None)
        gym.registry.pop(id_, None)


def test_unknown_id_raises_keyerror_listing_known_ids():
    with pytest.raises(KeyError) as err:
        make("slea/NoSuchEnv-v0")
    assert "unknown env id 'slea/NoSuchEnv-v0'" in str(err.value)
    assert "slea/Sokoban-v0" in str(err.value)


def test_missing_extra_error_names_the_extra(fake_ids):
    register(
        "slea/FakeMissing-v0",
        f"{__name__}:FakeEnv",
        family="fake",
        extra="fakeextra",
        requires=("slea_module_that_does_not_exist_xyz",),
    )
    fake_ids.append("slea/FakeMissing-v0")
    with pytest.raises(MissingExtraError) as err:
        make("slea/FakeMissing-v0")
    msg = str(err.value)
    assert "slea_module_that_does_not_exist_xyz" in msg
    assert "pip install 'slea[fakeextra]'" in msg
    assert isinstance(err.value, ImportError)
    assert registered()["slea/FakeMissing-v0"].missing() == ["slea_module_that_does_not_exist_xyz"]


def test_missing_module_without_extra_says_what_to_install(fake_ids):
    register(
        "slea/FakeMissing2-v0", f"{__name__}:FakeEnv", family="fake", requires=("another_missing_module_xyz",)
    )
    fake_ids.append("slea/FakeMissing2-v0")
    with pytest.raises(MissingExtraError, match="install another_missing_module_xyz"):
        make("slea/FakeMissing2-v0")


def test_contract_fills_info_and_never_raises(fake_ids):
    register("slea/Fake-v0", f"{__name__}:FakeEnv", family="fake", greeting="hi")
    fake_ids.append("slea/Fake-v0")
    env = make("slea/Fake-v0")
    obs, info = env.reset(seed=3)
    assert obs == "hi 3"
    assert info["goal"] == "say ok" and info["admissible_actions"] == ["ok", "boom"]
    assert info["task_type"] == "fake" and info["won"] is False and info["lost"] is False

    for bad in ["", "   ", None, 42]:
        obs2, reward, term, trunc, info = env.step(bad)  # type: ignore[arg-type]
        assert info["invalid"] is True and obs2 == obs and reward == 0.0 and not term and not trunc
        assert info["goal"] == "say ok" and "lost" in info
    # the engine raises: a fault (the episode ends, truncated), neither an invalid action nor a crash
    obs2, reward, term, trunc, info = env.step("boom")
    assert (obs2, reward, term, trunc) == (obs, 0.0, False, True)
    assert info["fault"] == "error" and info["invalid"] is False and info["error"] == "RuntimeError: engine crashed"
    assert info["goal"] == "say ok" and "lost" in info  # the contract's keys, as on every step
    obs2, reward, term, _, info = env.step("ok")
    assert (obs2, reward, term, info["invalid"], info["won"]) == ("fine", 1.0, True, False, True)
    with pytest.raises(NotImplementedError):
        env.get_state()


def test_gymnasium_make_works_for_registered_ids(fake_ids):
    register("slea/Fake2-v0", f"{__name__}:FakeEnv", family="fake")
    fake_ids.append("slea/Fake2-v0")
    env = gym.make("slea/Fake2-v0", greeting="yo")
    obs, info = env.reset(seed=1)
    assert obs == "yo 1" and info["task_type"] == "fake"
    assert env.step("ok")[1] == 1.0
    assert isinstance(env.unwrapped, FakeEnv)


def test_families_register_without_heavy_imports():
    specs = registered()
    assert specs["slea/TextWorld-v0"].family == "textworld"
    assert specs["slea/TextWorld-v0"].extra == "textworld"
    assert specs["slea/TextWorld-v0"].requires == ("textworld",)
    assert specs["slea/Sokoban-v0"].family == "sokoban" and specs["slea/Sokoban-v0"].requires == ()


def test_importing_slea_envs_does_not_import_engines():
    src = str(Path(base.__file__).parents[2])
    code = "import sys, slea.envs; print(sorted(m for m in ('textworld', 'jericho') if m in sys.modules))"
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "[]"


def test_pick_reads_the_option_then_the_seed_then_the_env_rng():
    env = FakeEnv()
    assert env._pick(5, seed=7, options={"game": 13}) == 3  # the option wins, modulo n
    assert env._pick(5, seed=7, options={"game": None}) == 2  # then the seed, modulo n
    assert env._pick(5, seed=7, options={"episode": 1}, key="episode") == 1
    env.reset(seed=42)
    draws = [env._pick(1000, seed=None, options={}) for _ in range(5)]
    env.reset(seed=42)
    assert [env._pick(1000, seed=None, options={}) for _ in range(5)] == draws  # the env's np_random
    assert all(0 <= d < 1000 for d in draws) and len(set(draws)) > 1


def test_base_instructions_are_the_list_picking_default():
    from slea.envs.base import DEFAULT_INSTRUCTIONS

    ins = FakeEnv().instructions
    assert ins is DEFAULT_INSTRUCTIONS and ins.answer_cue == "Your command:" and not ins.multiline
    assert "list of valid commands" in ins.system
    (user, answer), = ins.example
    assert user.endswith("- take apple\n- go north\n- open fridge\nYour command:") and answer == "take apple"


class DiceEnv(TextEnv):
    """Deterministic given its seed: each step's outcome comes from the env's own rng (np_random)."""

    snapshots = "replay"  # opts into the base's replay-from-seed-and-actions fallback

    def _reset(self, seed, options):
        self._goal, self._admissible, self.total = "roll", ["roll", "hold"], 0
        return f"start {options.get('tag', '')}", {}

    def _step(self, action):
        if action == "hold":
            return f"held at {self.total}", float(self.total), True, False, {}
        self.total += int(self.np_random.integers(1, 7))
        return f"total {self.total}", 0.0, False, False, {}


def test_replay_fallback_restores_the_rng_and_the_actions():
    env = DiceEnv()
    env.reset(seed=11, options={"tag": "x"})
    for a in ("roll", "bogus", "roll"):
        env.step(a)
    snap, seen = env.get_state(), env._last_obs
    assert snap == {"seed": 11, "options": {"tag": "x"}, "actions": ["roll", "bogus", "roll"]}
    expected = [env.step(a) for a in ("roll", "roll", "hold")]
    fresh = DiceEnv()
    fresh.reset(seed=99)
    fresh.step("roll")
    fresh.set_state(snap)
    assert fresh._last_obs == seen and fresh.get_state() == snap
    assert [fresh.step(a) for a in ("roll", "roll", "hold")] == expected
    env.reset(seed=None)
    with pytest.raises(RuntimeError, match="seed"):  # an unseeded episode cannot be replayed
        env.get_state()


def test_snapshot_support_reads_the_class_without_building_it(fake_ids):
    register("slea/Dice-v0", f"{__name__}:DiceEnv", family="fake")
    register("slea/Fake3-v0", f"{__name__}:FakeEnv", family="fake")
    fake_ids.extend(["slea/Dice-v0", "slea/Fake3-v0"])
    assert base.snapshot_support("slea/Dice-v0") == "replay"
    assert base.snapshot_support("slea/Fake3-v0") == "none"  # the default: no snapshots, no fallback


# The game-choosing rule the numbered-game families (Ballot, Recall, Sokoban) document, written out here on its own:
# options["game"], else the seed, modulo num_games when set; an unseeded reset draws from the env's np_random,
# below num_games or below 2**31 - 1 when there is no bound.
def _documented_game(num_games: int | None, seed: int | None, option: int | None, rng_seed: int) -> int:
    if option is not None:
        game = option
    elif seed is not None:
        game = seed
    else:
        rng, _ = gym.utils.seeding.np_random(rng_seed)
        game = int(rng.integers(num_games or 2**31 - 1))
    return game if num_games is None else game % num_games


@pytest.mark.parametrize("family, game_attr", [("ballot", "_game_id"), ("recall", "_game"), ("sokoban", "_game")])
@pytest.mark.parametrize("num_games", [None, 1, 3, 7])
def test_numbered_game_families_choose_the_documented_game(family: str, game_attr: str, num_games: int | None):
    from slea.envs.ballot import BallotEnv
    from slea.envs.recall import RecallEnv
    from slea.envs.sokoban import SokobanEnv

    cls = {"ballot": BallotEnv, "recall": RecallEnv, "sokoban": SokobanEnv}[family]
    for seed in (None, 0, 4, 9, 12345):
        for option in (None, 0, 5, 11):
            rng_seed = 1000 + (seed or 0)
            env = cls(num_games=num_games)
            env.reset(seed=rng_seed)  # seeds the env's np_random; the unseeded reset below draws from it
            obs, _ = env.reset(seed=seed, options={} if option is None else {"game": option})
            expected = _documented_game(num_games, seed, option, rng_seed)
            assert getattr(env, game_attr) == expected, (family, num_games, seed, option)
            # the episode is the chosen game's: the same observation as a fresh env told that game by seed
            assert cls(num_games=num_games).reset(seed=expected)[0] == obs
