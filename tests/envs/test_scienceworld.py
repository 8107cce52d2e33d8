"""ScienceWorld family: task names, splits, gold paths, determinism, bad actions, snapshots, missing extras.

The engine tests share one JVM (module fixture ``sw``; ~1-3 s to start) and play short tasks with the
valid-action lists off (they cost ~0.1-0.3 s per step); one test turns them on.
"""

from __future__ import annotations

import importlib.util
import shutil
from typing import Any

import gymnasium as gym
import pytest

import slea.envs  # noqa: F401  (registers the families)
from slea.envs import MissingExtraError, make, registered
from slea.envs import scienceworld as sw_mod

HAVE_ENGINE = importlib.util.find_spec("scienceworld") is not None and shutil.which("java") is not None
needs_engine = pytest.mark.skipif(not HAVE_ENGINE, reason="needs the scienceworld package and Java >= 11")

SHORT_TASKS = ["find-living-thing", "lifespan-longest-lived", "chemistry-mix"]


@pytest.fixture(scope="module")
def sw():
    if not HAVE_ENGINE:
        pytest.skip("needs the scienceworld package and Java >= 11")
    env = sw_mod.ScienceWorldEnv(tasks=SHORT_TASKS, split="dev", admissible=False)
    yield env
    env.close()


# -- names, splits, helpers (no engine) -------------------------------------------------------------------
def test_task_names_ids_and_eto_names():
    assert len(sw_mod.TASK_NAMES) == 30 and len(set(sw_mod.TASK_NAMES)) == 30
    assert set(sw_mod.SPLIT_SIZES) == set(sw_mod.TASK_NAMES)
    assert sw_mod.canonical_task("4-1") == "find-living-thing"
    assert sw_mod.canonical_task("task-3-find-living-thing") == "find-living-thing"
    assert sw_mod.canonical_task("task-2a-test-conductivity") == "test-conductivity"
    assert (
        sw_mod.canonical_task("task-10-measure-melting-point-(known-substance)")
        == "measure-melting-point-known-substance"
    )
    assert sw_mod.canonical_task("Find_Living_Thing") == "find-living-thing"
    assert len(sw_mod.resolve_tasks(None)) == 30 and len(sw_mod.resolve_tasks("eto")) == 24
    assert "mendelian-genetics-known-plant" not in sw_mod.ETO_TASKS
    assert sw_mod.resolve_tasks(["boil", "1-1", "melt"]) == ["boil", "melt"]
    for bad in ["fly", "11-1", ""]:
        with pytest.raises(ValueError):
            sw_mod.canonical_task(bad)


def test_splits_are_contiguous_disjoint_and_aliased():
    for task, (n_train, n_dev, n_test) in sw_mod.SPLIT_SIZES.items():
        train, dev, test = (sw_mod.variations(task, s) for s in ("train", "dev", "test"))
        assert (len(train), len(dev), len(test)) == (n_train, n_dev, n_test)
        assert train.start == 0 and dev.start == train.stop and test.start == dev.stop
    assert sw_mod.variations("boil", "heldout") == sw_mod.variations("boil", "dev")
    assert sw_mod.variations("boil", "seen") == range(14, 21)
    assert sw_mod.variations("boil", "unseen") == range(21, 30)
    with pytest.raises(ValueError):
        sw_mod.variations("boil", "validation-2")
    episodes = sw_mod.split_episodes(["boil", "find-plant"], "dev")
    assert episodes[:4] == [("boil", 14), ("find-plant", 150), ("boil", 15), ("find-plant", 151)]
    assert len(episodes) == 7 + 75
    assert sw_mod.split_episodes(["boil", "find-plant"], "test", variations_per_task=2) == [
        ("boil", 21),
        ("find-plant", 225),
        ("boil", 22),
        ("find-plant", 226),
    ]
    eto_seen = set(sw_mod.split_episodes("eto", "seen"))
    eto_unseen = set(sw_mod.split_episodes("eto", "unseen"))
    assert eto_seen.isdisjoint(eto_unseen) and eto_seen.isdisjoint(sw_mod.split_episodes("eto", "train"))


def test_simplifications_and_text_helpers():
    assert sw_mod.canonical_simplifications("easy") == "easy"
    assert sw_mod.canonical_simplifications(["openDoors", "teleportAction", "openDoors"]) == (
        "openDoors,teleportAction"
    )
    with pytest.raises(ValueError):
        sw_mod.canonical_simplifications("fly")
    a = "In it, you see: \n\tthe agent\n\ta cup (red)\n\ta bowl\nYou also see:\n\tdoor B\n\tdoor A \n"
    b = "In it, you see: \n\ta bowl\n\tthe agent\n\ta cup (red)\nYou also see:\n\tdoor A\n\tdoor B\n"
    assert sw_mod.canonical_observation(a) == sw_mod.canonical_observation(b)
    assert sw_mod.canonical_observation(a).splitlines()[1] == "\ta bowl"
    actions = [f"open {i}" for i in range(10)] + ["look around", "wait", "wait1"]
    capped = sw_mod.cap_actions(sorted(actions), 5)
    assert len(capped) == 5 and "look around" in capped and {"wait", "wait1"} & set(capped)
    assert sw_mod.cap_actions(actions, None) == actions


def test_constructor_validation():
    with pytest.raises(ValueError):
        sw_mod.ScienceWorldEnv(split="nope")
    with pytest.raises(ValueError):
        sw_mod.ScienceWorldEnv(max_admissible=0)
    with pytest.raises(ValueError):
        sw_mod.ScienceWorldEnv(tasks=["boil"], variations_per_task=0)
    env = sw_mod.ScienceWorldEnv(tasks="eto", split="unseen", variations_per_task=1)
    assert env.num_episodes == 24 and env.split == "test" and env._engine is None  # no JVM before reset
    env.close()
    # an explicit episode list, e.g. ETO's dev_indices.json (its own task names)
    eto = [["task-1-boil", 14], ["task-3-find-plant", 175], ["task-1-boil", 15]]
    env = sw_mod.ScienceWorldEnv(episodes=eto)
    assert env.episodes == [("boil", 14), ("find-plant", 175), ("boil", 15)] and env.tasks == [
        "boil",
        "find-plant",
    ]
    with pytest.raises(ValueError):
        sw_mod.ScienceWorldEnv(episodes=[("boil", 30)])
    with pytest.raises(ValueError):
        sw_mod.ScienceWorldEnv(episodes=[])


def test_java_options_are_set_only_while_the_jvm_starts(monkeypatch):
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Dfoo=1")
    with sw_mod._java_tool_options("-Xmx1g"):
        assert sw_mod.os.environ["JAVA_TOOL_OPTIONS"] == "-Dfoo=1 -Xmx1g"
    assert sw_mod.os.environ["JAVA_TOOL_OPTIONS"] == "-Dfoo=1"
    monkeypatch.delenv("JAVA_TOOL_OPTIONS")
    with sw_mod._java_tool_options(sw_mod.DEFAULT_JAVA_OPTS):
        assert "-Xmx" in sw_mod.os.environ["JAVA_TOOL_OPTIONS"]
    assert "JAVA_TOOL_OPTIONS" not in sw_mod.os.environ


# -- the engine --------------------------------------------------------------------------------------------
@needs_engine
def test_split_table_matches_the_engine(sw):
    engine = sw._engine or (sw._server() and sw._engine)
    for task in ("boil", "find-living-thing"):
        engine.load(task, 0, "")
        assert engine.get_variations_train() == list(sw_mod.variations(task, "train"))
        assert engine.get_variations_dev() == list(sw_mod.variations(task, "dev"))
        assert engine.get_variations_test() == list(sw_mod.variations(task, "test"))
    assert sorted(engine.get_task_names()) == sorted(sw_mod.TASK_NAMES)


@needs_engine
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gold_path_reaches_full_score(sw, seed):
    obs, info = sw.reset(seed=seed)
    assert info["task_type"] == SHORT_TASKS[seed] and info["variation"] in sw_mod.variations(
        SHORT_TASKS[seed], "dev"
    )
    assert "is called the" in obs.split("\n")[0] and info["goal"].startswith("Your task is to")
    walkthrough = info["walkthrough"]
    assert 0 < len(walkthrough) <= 25
    total = 0.0
    for i, action in enumerate(walkthrough):
        obs, reward, terminated, truncated, info = sw.step(action)
        total += reward
        assert not info["invalid"] and not truncated
        assert terminated == (i == len(walkthrough) - 1)
    assert info["won"] and not info["lost"] and info["score"] == 100
    assert total == pytest.approx(1.0)
    # the episode is over: further actions are refused without reaching the engine
    assert sw.step("look around")[4]["invalid"] is True


@needs_engine
def test_reset_and_steps_are_deterministic_by_seed(sw):
    """A second env (its own JVM, built by gymnasium.make) sees the same episodes; close() stops its JVM."""
    env = gym.make("slea/ScienceWorld-v0", tasks=SHORT_TASKS, split="dev", admissible=False)
    other = env.unwrapped
    try:
        for seed in (0, 4):  # 4 -> episode 4: the second variation of lifespan-longest-lived
            a, b = sw.reset(seed=seed), other.reset(seed=seed)
            assert a[0] == b[0]
            keys = ("goal", "task_type", "variation", "episode", "score")
            assert {k: a[1][k] for k in keys} == {k: b[1][k] for k in keys}
            for action in a[1]["walkthrough"][:4]:
                assert sw.step(action)[:3] == other.step(action)[:3]
        assert sw.reset(seed=0)[0] == sw.reset(seed=sw.num_episodes)[0]
        assert sw.reset(seed=1)[1]["episode"] == 1
        opts = {"task": "chemistry-mix", "variation": 16}
        assert sw.reset(options=opts)[1]["variation"] == 16
        with pytest.raises(ValueError):
            sw.reset(options={"task": "chemistry-mix", "variation": 0})  # a train variation
        assert other.jvm_start_s is not None
        proc = other._engine._gateway.java_process
    finally:
        env.close()
    assert other._engine is None
    proc.wait(timeout=10)  # the JVM is gone


@needs_engine
def test_admissible_actions(sw):
    sw.admissible = True
    try:
        _, info = sw.reset(seed=0)
        full = info["admissible_actions"]
        assert len(full) > 100 and full == sorted(full) and "look around" in full
        assert info["walkthrough"][0] in full
        sw.max_admissible = 30
        _obs, _r, _t, _tr, info = sw.step("look around")
        capped = info["admissible_actions"]
        assert len(capped) == 30 and set(capped) <= set(full)
        assert len({a.split()[0] for a in capped}) >= 10  # every kind of action represented
    finally:
        sw.admissible, sw.max_admissible = False, None


@needs_engine
@pytest.mark.parametrize("bad", ["xyzzy", "0", "take the moon", "q" * 5000, "\x00\x01"])
def test_bad_actions_get_an_engine_answer(sw, bad):
    _obs0, _ = sw.reset(seed=0)
    obs, _reward, terminated, truncated, info = sw.step(bad)
    assert info["invalid"] is True and not terminated and not truncated
    assert isinstance(obs, str) and obs
    assert sw.step("look around")[4]["invalid"] is False  # the engine is still fine


@needs_engine
def test_commands_are_normalised(sw):
    assert sw_mod.normalize_command('  "Open  door to outside."  ') == "Open door to outside"
    assert sw_mod.normalize_command("0") == "0" and sw_mod.normalize_command("...") == "..."
    _, info = sw.reset(seed=0)
    first = info["walkthrough"][0]
    _obs, _r, _t, _tr, info = sw.step(f"`{first.upper()}.`")
    assert not info["invalid"]


@needs_engine
def test_empty_and_ambiguous_actions(sw):
    sw.reset(seed=0)
    assert sw.step("")[4]["invalid"] is True
    obs, _, _, _, info = sw.step("open door")
    assert info["ambiguous"] and not info["invalid"] and "0:" in obs
    obs, _, _, _, info = sw.step("0")  # answer the engine's question
    assert not info["invalid"] and "door" in obs.lower()


@needs_engine
def test_focusing_on_the_wrong_thing_loses(sw):
    sw.reset(seed=0)
    _obs, reward, terminated, truncated, info = sw.step("focus on air")
    assert terminated and not truncated and info["lost"] and not info["won"]
    assert info["raw_score"] < 0 and info["score"] == 0 and reward == 0.0


@needs_engine
def test_get_state_set_state_round_trip(sw):
    _, info = sw.reset(seed=2)
    for action in info["walkthrough"][:3]:
        sw.step(action)
    snap = sw.get_state()
    seen = sw.render()
    assert snap["task"] == "chemistry-mix" and len(snap["actions"]) == 3
    sw.reset(seed=0)
    sw.set_state(snap)
    assert sw.render() == seen and sw.get_state() == snap
    result: Any = None
    for action in info["walkthrough"][3:]:
        result = sw.step(action)
    assert result is not None and result[4]["won"]


# -- missing extras --------------------------------------------------------------------------------------
def test_missing_extra_message(monkeypatch):
    spec = registered()["slea/ScienceWorld-v0"]
    assert spec.extra == "scienceworld" and "scienceworld" in spec.requires
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "scienceworld" else real(name, *a)
    )
    with pytest.raises(MissingExtraError, match=r"pip install 'slea\[scienceworld\]'"):
        make("slea/ScienceWorld-v0")


def test_missing_java_message(monkeypatch):
    monkeypatch.setattr(sw_mod.shutil, "which", lambda name: None)
    env = sw_mod.ScienceWorldEnv(tasks=["boil"])
    with pytest.raises(MissingExtraError, match="Java"):
        env.reset(seed=0)
    env.close()


@needs_engine
def test_instructions_name_only_the_engines_actions(sw):
    """Every action form the instructions list is one of the engine's templates (X, Y, LOC are its OBJ)."""
    import re

    sw.reset(seed=0)
    templates = set(sw._engine.get_possible_actions())
    listed = re.search(r"Actions: (.*?)\. ", sw.instructions.system).group(1)
    forms = [re.sub(r"\s*\(.*\)$", "", f.strip()) for f in listed.split(", ")]
    assert len(forms) >= 15
    for form in forms:
        template = re.sub(r"\b(X|Y|LOC)\b", "OBJ", form).replace("go to OBJ", "go OBJ")
        assert template in templates, form
    _obs, _r, _t, _tr, info = sw.step("go to kitchen")  # "go to LOC" is how the engine is driven
    assert not info["invalid"]
