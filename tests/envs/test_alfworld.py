"""ALFWorld family: the offline generator (every task type solved by the engine's expert), the env contract,
determinism, bad actions, snapshots, explicit game files, the official-data adapter and missing extras.

Games come from the module fixture ``alf_cache``: one generated game per task type (~1 s each) in a
temporary cache.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import slea.envs  # noqa: F401  (registers the families)
from slea.envs import MissingExtraError, make, registered
from slea.envs import alfworld as alf

HAVE_ENGINE = all(importlib.util.find_spec(m) is not None for m in ("alfworld", "textworld", "fast_downward"))
needs_engine = pytest.mark.skipif(
    not HAVE_ENGINE, reason="needs the alfworld extra (alfworld, textworld[pddl])"
)
ORDER = ["pick", "look", "clean", "heat", "cool", "pick_two"]


@pytest.fixture(scope="module")
def alf_cache(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not HAVE_ENGINE:
        pytest.skip("needs the alfworld extra (alfworld, textworld[pddl])")
    cache: Path = tmp_path_factory.mktemp("alf-cache")
    paths = alf.prepare_games(ORDER, "train", 6, cache)
    return {"dir": cache, "train": paths}


@pytest.fixture(scope="module")
def alf_env(alf_cache: dict[str, Any]):
    env = make("slea/ALFWorld-Gen-v0", tasks=ORDER, num_games=6, cache_dir=alf_cache["dir"])
    yield env
    env.close()


# -- names and splits (no engine) ----------------------------------------------------------------------------
def test_task_types_and_splits():
    assert alf.canonical_task("pick_two_obj_and_place") == "pick_two"
    assert alf.canonical_task("Pick-Two") == "pick_two" and alf.canonical_task("look") == "look"
    with pytest.raises(ValueError):
        alf.canonical_task("slice")
    assert alf.resolve_tasks(None) == ORDER
    train = alf.split_games(None, "train", 12)
    held = alf.split_games(None, "heldout", 12)
    seen = alf.split_games(None, "seen", 12)
    assert [t for t, _ in train[:7]] == ORDER + ["pick"]
    seeds = [{s for _, s in g} for g in (train, held, seen)]
    assert seeds[0].isdisjoint(seeds[1]) and seeds[0].isdisjoint(seeds[2]) and seeds[1].isdisjoint(seeds[2])
    assert alf.split_games(None, "unseen", 1) == alf.split_games(None, "eval_out_of_distribution", 1)
    assert alf.official_split("heldout") == "valid_unseen" and alf.official_split("seen") == "valid_seen"
    with pytest.raises(ValueError):
        alf.split_games(None, "validation", 2)
    with pytest.raises(ValueError):
        alf.split_games(None, "train", alf.MAX_GAMES_PER_SPLIT + 1)


def test_task_type_from_folder_names(tmp_path):
    assert alf.task_type_of(
        "/d/valid_unseen/pick_two_obj_and_place-Book-None-Drawer-301/trial_T1/game.tw-pddl"
    ) == ("pick_two")
    assert alf.task_type_of("/d/train/pick_and_place_simple-Apple-None-Fridge-1/t/game.tw-pddl") == "pick"
    assert alf.task_type_of("/d/look_at_obj_in_light-CD-DeskLamp-None-2/t/game.tw-pddl") == "look"
    game = tmp_path / "somewhere" / "game.tw-pddl"
    game.parent.mkdir()
    (game.parent / "traj_data.json").write_text(json.dumps({"task_type": "pick_cool_then_place_in_recep"}))
    assert alf.task_type_of(game) == "cool"
    assert alf.task_type_of(tmp_path / "x" / "game.tw-pddl") == "alfworld"


def test_normalize_and_cache_dir(monkeypatch, tmp_path):
    assert alf.normalize_command('  "Go To  Fridge 1."  ') == "go to fridge 1"
    monkeypatch.setenv("SLEA_CACHE_DIR", str(tmp_path))
    assert alf.default_cache_dir() == tmp_path / "alfworld"
    path = alf.game_path("clean", 1002)
    assert path.parts[-3:] == ("pick_clean_then_place_in_recep", "seed-1002", "game.tw-pddl")


# -- the generator ------------------------------------------------------------------------------------------
@needs_engine
def test_every_task_type_is_generated_in_the_official_layout(alf_cache):
    for task, path in zip(ORDER, alf_cache["train"], strict=True):
        assert path.name == "game.tw-pddl" and alf.task_type_of(path) == task
        game = json.loads(path.read_text())
        traj = json.loads(path.with_name("traj_data.json").read_text())
        assert game["solvable"] is True and game["walkthrough"]
        assert set(game) >= {"pddl_domain", "grammar", "pddl_problem", "walkthrough", "solvable"}
        assert traj["task_type"] == alf.TASK_TYPES[task] and traj["pddl_params"]["object_target"]
        assert "UNKNOWN GOAL" not in game["grammar"] and "(:goal" in game["pddl_problem"]
        assert len(game["walkthrough"]) <= 40
    assert not list(alf_cache["dir"].rglob(".tmp-*"))  # nothing left over from generation


@needs_engine
@pytest.mark.parametrize("game", range(6))
def test_the_expert_walkthrough_wins_every_task_type(alf_env, game):
    obs, info = alf_env.reset(seed=game)
    assert info["task_type"] == ORDER[game] and info["task"] == alf.TASK_TYPES[ORDER[game]]
    assert obs.startswith("You are in the middle of a room") and "Welcome" not in obs
    assert info["goal"] and info["goal"] in obs and not info["won"]
    assert info["admissible_actions"] and "help" not in info["admissible_actions"]
    walkthrough = info["walkthrough"]
    for i, command in enumerate(walkthrough):
        assert command in info["admissible_actions"]
        _obs, reward, terminated, truncated, info = alf_env.step(command)
        assert not info["invalid"] and not truncated
        assert terminated == (i == len(walkthrough) - 1)
        assert reward == (1.0 if terminated else 0.0)
    assert info["won"] is True
    assert alf_env.step("look")[4]["invalid"] is True  # the episode is over


@needs_engine
def test_following_expert_actions_after_a_detour_wins(alf_env):
    _, info = alf_env.reset(seed=5)  # pick_two: the expert's state tracking of "move" is the fix under test
    for command in info["admissible_actions"][:2]:  # a detour the expert did not plan
        info = alf_env.step(command)[4]
    for _ in range(60):
        assert info["expert_action"]
        info = alf_env.step(info["expert_action"])[4]
        if info["won"]:
            break
    assert info["won"]


@needs_engine
def test_generation_is_cached_and_deterministic(alf_cache, tmp_path):
    before = dict(alf.GENERATION_STATS)
    assert alf.prepare_games(ORDER, "train", 6, alf_cache["dir"]) == alf_cache["train"]
    assert alf.GENERATION_STATS["generated"] == before["generated"]
    again = alf.ensure_game("look", 1001, tmp_path)  # regenerate game 1 elsewhere
    assert alf.GENERATION_STATS["generated"] == before["generated"] + 1
    first = alf_cache["train"][1]
    assert again.read_bytes() == first.read_bytes()
    assert again.with_name("traj_data.json").read_bytes() == first.with_name("traj_data.json").read_bytes()


_SUBPROCESS = r"""
import json, sys, pathlib
from slea.envs import alfworld_gen as g
eng = g.make_engine("handcoded", accelerate=False)
folder, _ = g.generate("clean", 1002, pathlib.Path(sys.argv[1]), eng)
with g.engine_guard():
    eng.load(str(folder / "game.tw-pddl"))
    state = eng.reset()
    text = [state["feedback"], sorted(state["admissible_commands"])]
    for cmd in json.loads((folder / "game.tw-pddl").read_text())["walkthrough"]:
        state, _, _ = eng.step(cmd)
        text += [state["feedback"], sorted(state["admissible_commands"]), state["extra.expert_plan"]]
print(json.dumps({"game": (folder / "game.tw-pddl").read_text(), "text": text}))
"""


@needs_engine
def test_same_game_and_text_without_acceleration_and_with_another_hash_seed(alf_cache, tmp_path):
    """A fresh interpreter (other PYTHONHASHSEED, engine not accelerated) makes the same game and text."""
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", _SUBPROCESS, str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    path = alf_cache["train"][2]
    assert theirs["game"] == path.read_text()
    from slea.envs import alfworld_gen as g

    eng = g.make_engine("handcoded")
    with g.engine_guard():
        eng.load(str(path))
        state = eng.reset()
        text = [state["feedback"], sorted(state["admissible_commands"])]
        for cmd in json.loads(path.read_text())["walkthrough"]:
            state, _, _ = eng.step(cmd)
            text += [state["feedback"], sorted(state["admissible_commands"]), state["extra.expert_plan"]]
    assert json.loads(json.dumps(text)) == theirs["text"]


# -- the env contract -------------------------------------------------------------------------------------------
@needs_engine
def test_reset_and_steps_are_deterministic_by_seed(alf_env, alf_cache):
    other = alf.ALFWorldEnv(tasks=ORDER, num_games=6, cache_dir=alf_cache["dir"], source="generated")
    try:
        for seed in (3, 9):
            a, b = alf_env.reset(seed=seed), other.reset(seed=seed)
            assert a == b and a[1]["game"] == seed % 6
            for command in a[1]["admissible_actions"][:3] + a[1]["walkthrough"][:3]:
                assert alf_env.step(command) == other.step(command)
        assert alf_env.reset(options={"game": 2})[1]["task_type"] == "clean"
    finally:
        other.close()
    assert sys.argv[0] != "translate.py"  # fast-downward's translator must not leak into sys.argv


@pytest.mark.parametrize(
    "bad", ["xyzzy", "take the moon from fridge 1", "go to fridge 99", "\x00", "q" * 10_000]
)
@needs_engine
def test_bad_actions_are_invalid_without_reaching_the_engine(alf_env, bad):
    alf_env.reset(seed=0)
    state = alf_env.get_state()
    obs, reward, terminated, truncated, info = alf_env.step(bad)
    assert (
        info["invalid"] is True and obs == alf.NOTHING and reward == 0.0 and not terminated and not truncated
    )
    assert alf_env.get_state() == state and info["admissible_actions"]
    assert alf_env.step("")[4]["invalid"] is True


@needs_engine
def test_old_put_verb_and_case_are_accepted(alf_env):
    _, info = alf_env.reset(seed=0)
    walkthrough = info["walkthrough"]
    for command in walkthrough[:-1]:
        alf_env.step(command)
    last = walkthrough[-1]
    assert last.startswith("move ")
    obj, recep = last[len("move ") :].split(" to ")
    _obs, reward, terminated, _, info = alf_env.step(f"Put {obj.upper()} in {recep}.")
    assert not info["invalid"] and terminated and reward == 1.0


@needs_engine
def test_get_state_set_state_round_trip(alf_env, alf_cache):
    _, info = alf_env.reset(seed=3)
    for command in info["walkthrough"][:4]:
        alf_env.step(command)
    snap, seen = alf_env.get_state(), alf_env.render()
    fresh = alf.ALFWorldEnv(
        tasks=ORDER, num_games=6, cache_dir=alf_cache["dir"], source="generated", expert=None
    )
    try:
        fresh.reset(seed=0)
        fresh.set_state(snap)
        assert fresh.render() == seen and fresh.get_state() == snap
        result: Any = None
        for command in info["walkthrough"][4:]:
            result = fresh.step(command)
        assert result is not None and result[4]["won"] and result[4]["expert_action"] is None
        with pytest.raises(ValueError):
            fresh.set_state({**snap, "game": 17})
    finally:
        fresh.close()


@needs_engine
def test_gymnasium_make_plays_explicit_game_files(alf_cache, tmp_path):
    # an ALFWorld-style folder name gives the task type
    folder = tmp_path / "valid_unseen" / "pick_heat_then_place_in_recep-Mug-None-Fridge-7" / "trial_T1"
    shutil.copytree(alf_cache["train"][3].parent, folder)
    env = gym.make("slea/ALFWorld-v0", game_files=[folder / "game.tw-pddl"], expert="planner")
    try:
        _, info = env.reset(seed=4)
        assert info["task_type"] == "heat" and info["game"] == 0
        assert info["expert_action"]  # the planner's next command
        for _ in range(40):
            info = env.step(info["expert_action"])[4]
            if info["won"]:
                break
        assert info["won"]
    finally:
        env.close()


@needs_engine
def test_official_layout_adapter(alf_cache, tmp_path, monkeypatch):
    root = tmp_path / "alfworld_data"
    unseen = root / "json_2.1.1" / "valid_unseen"
    names = {
        "pick_and_place_simple-CD-None-Drawer-301/trial_T1": 0,
        "look_at_obj_in_light-Watch-DeskLamp-None-302/trial_T2": 1,
        "pick_and_place_with_movable_recep-Pen-Mug-Desk-303/trial_T3": 0,  # not one of the six: skipped
        "pick_and_place_simple-AppleSliced-None-Fridge-304/trial_T4": 0,  # sliced: skipped
        "pick_two_obj_and_place-Book-None-Bed-305/trial_T5": 5,  # marked unsolvable below: skipped
    }
    for name, game in names.items():
        shutil.copytree(alf_cache["train"][game].parent, unseen / name)
    bad = unseen / "pick_two_obj_and_place-Book-None-Bed-305/trial_T5/game.tw-pddl"
    bad.write_text(json.dumps({**json.loads(bad.read_text()), "solvable": False}))
    (root / "json_2.1.1" / "train").mkdir()

    monkeypatch.setattr(alf.Path, "home", lambda: tmp_path / "home")  # no official data in ~/.cache/alfworld
    monkeypatch.setenv("ALFWORLD_DATA", str(root))
    env = make("slea/ALFWorld-v0", split="heldout")
    try:
        assert env.source == "official" and env.split == "valid_unseen" and env.num_games == 2
        types = [env.reset(seed=i)[1]["task_type"] for i in range(2)]
        assert types == ["look", "pick"]  # sorted paths: look_at... < pick_and...
        _, info = env.reset(seed=1)
        for command in info["walkthrough"]:
            info = env.step(command)[4]
        assert info["won"]
    finally:
        env.close()
    only_pick = make("slea/ALFWorld-Official-v0", split="unseen", tasks=["pick"], expert=None)
    assert only_pick.num_games == 1
    with pytest.raises(FileNotFoundError, match="no solvable ALFWorld games"):
        make("slea/ALFWorld-Official-v0", split="train")
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "nothing-here"))
    with pytest.raises(FileNotFoundError, match="alfworld-download"):
        make("slea/ALFWorld-Official-v0")
    assert make("slea/ALFWorld-v0", cache_dir=alf_cache["dir"], num_games=1).source == "generated"
    # alfworld-download's default folder is found without ALFWORLD_DATA
    monkeypatch.delenv("ALFWORLD_DATA")
    shutil.copytree(root, tmp_path / "home" / ".cache" / "alfworld")
    assert make("slea/ALFWorld-v0", split="unseen", expert=None).num_games == 2


def test_constructor_validation():
    with pytest.raises(ValueError):
        alf.ALFWorldEnv(expert="oracle", source="generated")
    with pytest.raises(ValueError):
        alf.ALFWorldEnv(source="web")
    with pytest.raises(ValueError):
        alf.ALFWorldEnv(game_files=[])
    env = alf.ALFWorldEnv(source="generated", split="unseen", num_games=3, tasks=["heat"])
    assert env.split == "heldout" and env.num_games == 3 and env._engine is None  # nothing made yet
    env.close()


# -- missing extras ------------------------------------------------------------------------------------------------
def test_missing_extra_message(monkeypatch):
    spec = registered()["slea/ALFWorld-v0"]
    assert spec.extra == "alfworld" and {"alfworld", "textworld", "fast_downward"} <= set(spec.requires)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "fast_downward" else real(name, *a)
    )
    with pytest.raises(MissingExtraError, match=r"pip install 'slea\[alfworld\]'"):
        make("slea/ALFWorld-Gen-v0")


# -- no silent fallbacks, no leaks ------------------------------------------------------------------------------
@needs_engine
def test_check_env_then_close_leaves_no_open_file_and_no_temporary_folder(alf_cache, tmp_path, monkeypatch):
    """Gymnasium's checker on ALFWorld-Gen, then close(): no ResourceWarning (textworld's own load left each game
    file to the garbage collector) and nothing new in the temporary folder."""
    import gc
    import tempfile
    import warnings

    from gymnasium.utils.env_checker import check_env

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = make("slea/ALFWorld-Gen-v0", tasks=["pick"], num_games=1, cache_dir=alf_cache["dir"])
        check_env(env, skip_render_check=True)
        env.close()
        del env
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not leaks, leaks
    assert list(scratch.iterdir()) == []


class _BrokenEngine:
    """An engine whose game load fails (a corrupt file, a broken PDDL translator)."""

    def load(self, game_file):
        raise ValueError("pddl translator crashed")


@needs_engine
def test_an_engine_failure_in_generation_is_an_error_not_an_unsolvable_room(tmp_path):
    from slea.envs import alfworld_gen as gen

    with pytest.raises(gen.GenerationError, match=r"pick game 5 \(attempt 0\): the engine failed: ValueError: "
                                                  r"pddl translator crashed"):
        gen.generate("pick", 5, tmp_path, _BrokenEngine())


@needs_engine
def test_the_expert_gives_up_with_an_empty_plan_but_other_failures_propagate(alf_cache, monkeypatch):
    """The hand-coded expert's own give-ups (HandCodedAgentFailed, alfworld's Exception("Timeout")) are "no
    advice"; any other exception inside the expert is an engine failure; the planner expert finding no plan for
    an unfinished game raises PlannerFailed (never an empty plan)."""
    from alfworld.agents.environment.alfred_tw_env import AlfredExpert
    from alfworld.agents.expert.handcoded_expert import HandCodedAgentFailed

    from slea.envs import alfworld_gen as gen

    game = str(alf_cache["train"][0])
    engine = gen.make_engine("handcoded")
    with gen.engine_guard():
        engine.load(game)
        for raised, gives_up in ((HandCodedAgentFailed(), True), (Exception("Timeout"), True),
                                 (KeyError("facts"), False)):
            def fail(self, exc=raised):
                raise exc

            monkeypatch.setattr(AlfredExpert, "_gather_infos", fail)
            if gives_up:
                assert engine.reset()["extra.expert_plan"] == []
            else:
                with pytest.raises(KeyError):
                    engine.reset()
        monkeypatch.undo()

        planner = gen.make_engine("planner")
        planner.load(game)
        assert planner.reset()["extra.expert_plan"]  # a plan from the start
        monkeypatch.setattr(AlfredExpert, "_gather_infos", lambda self: self.state.__setitem__("extra.expert_plan", []))
        with pytest.raises(gen.PlannerFailed):
            planner.reset()
