"""Recall, the positive control for experience retrieval: the contract, determinism, disjoint held-out names, a
scripted policy that knows the rule wins every game, a random one stays at (1/A)^k, and δ = 0.85 clusters group
every game's visit of a chamber type (the real ObservationIndex)."""

from __future__ import annotations

import math
import random
import re

import pytest
from gymnasium.utils.env_checker import check_env

import slea.envs  # noqa: F401  (registers slea/Recall-v0)
from slea.config import ExperienceSection
from slea.envs import make, registered
from slea.envs.recall import (
    CHAMBERS,
    GESTURES,
    INSTRUCTIONS,
    NAMES,
    RIGHT,
    THINGS,
    RecallEnv,
    chance,
    generate_game,
)
from slea.experience.clustering import ObservationIndex
from slea.experience.library import ExperienceLibrary
from slea.experience.manager import ExperienceManager
from slea.experience.retrieval import Retriever
from slea.types import Step, Trajectory

KINDS = [k for k, _ in CHAMBERS]


def _kind_of(obs: str) -> str:
    """What a policy that knows the rule does first: recognise the chamber type by its first sentence."""
    hits = [k for k, desc in CHAMBERS if obs.startswith(desc.split(".")[0])]
    assert len(hits) == 1, obs
    return hits[0]


def _play(env: RecallEnv, seed: int, policy) -> tuple[bool, float, int]:
    obs, info = env.reset(seed=seed)
    total, steps = 0.0, 0
    while True:
        obs, reward, terminated, truncated, info = env.step(policy(obs, info))
        total += reward
        steps += 1
        assert not info["invalid"]
        if terminated or truncated:
            return bool(info["won"]), total, steps


def test_registered_and_passes_gymnasiums_checker():
    assert registered()["slea/Recall-v0"].family == "recall"
    env = make("slea/Recall-v0")
    check_env(env, skip_render_check=True)
    env = make("slea/Recall-v0", split="heldout", chambers=2)
    check_env(env, skip_render_check=True)


def test_deterministic_under_a_seed():
    def trace(env: RecallEnv, seed: int) -> list:
        obs, info = env.reset(seed=seed)
        out = [(obs, tuple(info["admissible_actions"]))]
        for gesture in info["walkthrough"]:
            obs, reward, term, _, info = env.step(gesture)
            out.append((obs, reward, term, tuple(info["admissible_actions"] or ())))
        return out

    a, b = RecallEnv(), RecallEnv()
    for seed in (0, 7, 123456789):
        assert trace(a, seed) == trace(b, seed) == trace(a, seed)
    assert trace(a, 1) != trace(a, 2)
    assert generate_game("train", 5) == generate_game("train", 5)
    # num_games folds seeds onto a finite set
    env = RecallEnv(num_games=4)
    assert trace(env, 1) == trace(env, 5) and env.reset(seed=6)[1]["game"] == 2


def test_heldout_uses_names_and_objects_never_seen_in_training_with_the_same_types_and_right_gestures():
    assert not set(NAMES["train"]) & set(NAMES["heldout"])
    assert not set(THINGS["train"]) & set(THINGS["heldout"])
    seen = {"train": set(), "heldout": set()}
    kinds = {"train": set(), "heldout": set()}
    for split in ("train", "heldout"):
        env = RecallEnv(split=split)
        for seed in range(300):
            obs, info = env.reset(seed=seed)
            for chamber in generate_game(split, seed):
                seen[split] |= {chamber.name, chamber.thing}
                kinds[split].add(chamber.kind)
                assert chamber.right == RIGHT[chamber.kind]
            # the observation shows the split's own names only
            other = "heldout" if split == "train" else "train"
            assert not any(n in obs for n in NAMES[other] + THINGS[other])
            # the game's right gestures are the table's, by chamber type
            assert info["walkthrough"] == [RIGHT[c.kind] for c in generate_game(split, seed)]
    assert seen["train"] <= set(NAMES["train"] + THINGS["train"])
    assert seen["heldout"] <= set(NAMES["heldout"] + THINGS["heldout"])
    assert kinds["train"] == kinds["heldout"] == set(KINDS)
    # every gesture is right somewhere, and the right one is never named in the chamber's text
    assert set(RIGHT.values()) == set(GESTURES)
    for kind, desc in CHAMBERS:
        assert not any(g in desc.lower() for g in GESTURES), kind


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_a_policy_that_knows_the_rule_wins_every_game(split):
    env = RecallEnv(split=split)
    results = [_play(env, seed, lambda obs, info: RIGHT[_kind_of(obs)]) for seed in range(200)]
    assert all(won for won, _, _ in results)
    assert all(math.isclose(ret, 1.0) and steps == 3 for _, ret, steps in results)


def test_a_random_policy_stays_at_chance():
    """A uniform gesture in every chamber wins with (1/A)^k and clears Σ_j (1/A)^j chambers on average."""
    env = RecallEnv()
    rng = random.Random(0)
    n = 6000
    results = [_play(env, seed, lambda obs, info: rng.choice(info["admissible_actions"])) for seed in range(n)]
    p = chance(len(GESTURES), 3)
    assert math.isclose(p, 1 / 64)
    won = sum(w for w, _, _ in results) / n
    assert abs(won - p) < 4 * math.sqrt(p * (1 - p) / n)  # 1/64 ± 0.0064
    cleared = sum(ret * 3 for _, ret, _ in results) / n
    expect = sum((1 / len(GESTURES)) ** j for j in (1, 2, 3))  # 0.328
    assert abs(cleared - expect) < 0.03


def test_wrong_gestures_end_the_game_and_other_text_is_invalid():
    env = RecallEnv()
    obs, info = env.reset(seed=4)
    right = info["walkthrough"][0]
    same, reward, term, _, inf = env.step("dance a jig")
    assert inf["invalid"] and same == obs and reward == 0.0 and not term
    wrong = next(g for g in GESTURES if g != right)
    lost_obs, reward, term, _, inf = env.step(wrong)
    assert term and inf["lost"] and not inf["won"] and reward == 0.0 and lost_obs != obs
    assert env.step(right)[4]["invalid"]  # the attempt is over


def test_snapshots_restore_the_exact_state_in_another_instance():
    env = RecallEnv()
    _, info = env.reset(seed=11)
    env.step(info["walkthrough"][0])
    snap, seen = env.get_state(), env.render()
    rest = info["walkthrough"][1:]
    expected = [env.step(g)[:4] for g in rest]
    fresh = RecallEnv()
    fresh.reset(seed=12)
    fresh.set_state(snap)
    assert fresh.render() == seen
    assert [fresh.step(g)[:4] for g in rest] == expected


def test_clusters_at_085_group_each_chamber_type_across_games_and_splits():
    """The real ObservationIndex at δ = 0.85: one cluster per chamber type, built from training games, and every
    held-out observation (names and objects never seen) joins its type's training cluster."""
    index = ObservationIndex(threshold=0.85)
    by_kind: dict[str, set[int]] = {}
    for seed in range(200):
        for chamber in generate_game("train", seed):
            by_kind.setdefault(chamber.kind, set()).add(index.assign(chamber.text, "recall"))
    assert len(index) == len(KINDS)
    assert all(len(c) == 1 for c in by_kind.values())
    assert len({next(iter(c)) for c in by_kind.values()}) == len(KINDS)  # types never share a cluster
    for seed in range(200):
        for chamber in generate_game("heldout", seed):
            assert index.lookup(chamber.text, "recall") == next(iter(by_kind[chamber.kind]))
    assert len(index) == len(KINDS)


def test_bad_arguments_are_refused():
    for kwargs in ({"split": "test"}, {"num_games": 0}, {"chambers": 0}, {"chambers": 7},
                   {"kinds": ["nowhere"]}, {"kinds": ["forge"], "chambers": 2}):
        with pytest.raises(ValueError):
            RecallEnv(**kwargs)


def _episode(env: RecallEnv, seed: int, tid: int, manager: ExperienceManager, rng: random.Random) -> Trajectory:
    """One episode of a uniformly random player, as the rollout records it (anchor, cluster, reward per step)."""
    obs, info = env.reset(seed=seed)
    t = Trajectory(group_id=tid // 8, traj_id=tid, goal=info["goal"], task_type=info["task_type"], seed=seed)
    for turn in range(5):
        cluster = manager.cluster(obs, info["task_type"])
        action = rng.choice(info["admissible_actions"])
        nxt, reward, term, _, info = env.step(action)
        t.steps.append(Step(t.group_id, tid, turn, obs, [], [], [], reward=reward, done=term, valid=True,
                            action=action, task_type=t.task_type, cluster_id=cluster))
        obs = nxt
        if term:
            t.won = bool(info["won"])
            return t
    return t


def test_a_lesson_learned_in_training_names_the_right_gesture_at_the_held_out_chamber(tmp_path):
    """The mechanism end to end, without a model: the rule extractor and the library (the control's settings)
    learn from random play on training games; at a held-out game's chamber (names never seen) retrieval finds
    the chamber type's cluster, and its first lesson names that type's right gesture, its warning a wrong one."""
    cfg = ExperienceSection(mode="step", warmup_iters=0, min_entries=0, k_strat=6, k_warn=3, k_traj=3)
    rng = random.Random(0)
    with ExperienceManager(cfg, tmp_path / "lib.sqlite") as manager:
        env = RecallEnv()
        for it in range(10):  # 10 iterations of 4 games x 8 copies, evolving after each
            batch = [_episode(env, 4 * it + g, 32 * it + 8 * g + c, manager, rng) for g in range(4) for c in range(8)]
            manager.evolve(batch, it)
        held = RecallEnv(split="heldout")
        checked, warnings = set(), set()
        for seed in range(30):
            for chamber in generate_game("heldout", seed):
                got = manager.retrieve(chamber.text, task_type="recall", goal=held.reset(seed=seed)[1]["goal"],
                                       iteration=10)
                assert got.entry_ids, chamber.kind
                lines = got.text.splitlines()
                do = lines[lines.index("Do:") + 1]
                assert do.startswith(f"- '{chamber.right}' earned the reward"), (chamber.kind, got.text)
                # every strategy shown here starts with this chamber's gesture: a plan is linked where it starts
                end = lines.index("Avoid:") if "Avoid:" in lines else len(lines)
                for line in lines[lines.index("Do:") + 1:end]:
                    assert re.findall(r"'(\w+)", line)[0] == chamber.right, (chamber.kind, got.text)
                if "Avoid:" in lines:  # a warning, when one is linked here, names a wrong gesture
                    warned = re.findall(r"'(\w+)'", lines[lines.index("Avoid:") + 1])
                    assert warned and chamber.right not in warned, (chamber.kind, got.text)
                    warnings.add(chamber.kind)
                checked.add(chamber.kind)
        assert checked == set(KINDS) and len(warnings) >= 3


def test_the_example_with_a_lesson_shows_it_as_the_library_renders_it_and_follows_it(tmp_path):
    """``rollout.experience_in: user``: Recall's example exchange holds a lesson block exactly as retrieval renders
    one strategy, just before the cue (where the builder puts the real turn's), and answers the gesture it names —
    the second listed one, so following the lesson is not answering the first gesture listed."""

    lib = ExperienceLibrary(tmp_path / "lib.sqlite")
    eid = lib.add("'shrug' earned the reward on this kind of task.", zone="pos", score=1.0, level="example").entry_id
    rendered, ids, _ = Retriever(lib).render([eid])
    assert ids == [eid]
    (user, answer), = INSTRUCTIONS.example_with_experience
    assert user.endswith(f"\n{rendered}\nYour gesture:")
    assert user.replace(f"\n{rendered}", "") == INSTRUCTIONS.example[0][0]  # otherwise the plain example
    assert answer == "shrug" and user.index("- nod") < user.index("- shrug")
