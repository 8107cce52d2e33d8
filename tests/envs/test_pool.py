"""EnvPool: N groups x G copies, per-group seeds, stepping only live envs."""

from __future__ import annotations

import pytest

import slea.envs  # noqa: F401
from slea.envs.pool import EnvPool


def test_layout_and_group_resets():
    pool = EnvPool("slea/Sokoban-v0", num_groups=3, group_size=4)
    assert len(pool) == 12 and pool.group_of(0) == 0 and pool.group_of(5) == 1 and pool.group_of(11) == 2
    assert list(pool.members(2)) == [8, 9, 10, 11]
    assert list(pool.group_ids) == [0] * 4 + [1] * 4 + [2] * 4
    assert pool.all_done and pool.live() == []
    out = pool.reset([10, 20, 30])
    assert len(out) == 12 and not pool.done.any()
    for g in range(3):
        firsts = {out[i][0] for i in pool.members(g)}
        assert len(firsts) == 1  # the G copies see the same first observation
        assert all(out[i][1]["group"] == g for i in pool.members(g))
    assert len({out[0][0], out[4][0], out[8][0]}) == 3
    with pytest.raises(ValueError):
        pool.reset([1, 2])
    with pytest.raises(IndexError):
        pool.group_of(12)


def test_step_only_live_envs_and_done_mask():
    pool = EnvPool("slea/Sokoban-v0", num_groups=2, group_size=2)
    out = pool.reset([5, 6])
    walk = out[0][1]["walkthrough"]
    results = None
    for action in walk:
        results = pool.step({0: action, 2: "xyzzy"})
        assert set(results) == {0, 2}
    assert results is not None and results[0][2] and results[0][1] == 1.0
    assert results[2][4]["invalid"] and results[2][4]["group"] == 1
    assert pool.done.tolist() == [True, False, False, False] and pool.live() == [1, 2, 3]
    with pytest.raises(ValueError):
        pool.step({0: "up"})  # finished
    with pytest.raises(ValueError):
        pool.step({99: "up"})
    pool.mark_done([1, 2, 3])
    assert pool.all_done
    pool.reset([5, 6])
    assert pool.live() == [0, 1, 2, 3]


def test_step_one_is_the_single_wrap_point():
    calls: list[tuple[int, str]] = []

    class CountingPool(EnvPool):
        def step_one(self, i, action):
            calls.append((i, action))
            return super().step_one(i, action)

    pool = CountingPool("slea/Sokoban-v0", num_groups=1, group_size=3, env_kwargs={"num_games": 4})
    pool.reset([1])
    pool.step({2: "up", 0: "down"})
    assert calls == [(0, "down"), (2, "up")]


def test_snapshots_pass_through():
    pool = EnvPool("slea/Sokoban-v0", num_groups=1, group_size=2)
    out = pool.reset([3])
    state = pool.get_state(0)
    pool.step({0: out[0][1]["walkthrough"][0]})
    pool.set_state(1, state)
    assert pool.envs[1].render() == out[0][0]


def test_textworld_pool_groups_play_the_same_game(tw_cache):
    kwargs = {"tasks": tw_cache["tasks"], "num_games": 2, "cache_dir": tw_cache["dir"]}
    with EnvPool("slea/TextWorld-v0", num_groups=2, group_size=3, env_kwargs=kwargs) as pool:
        out = pool.reset([0, 1])
        for g in range(2):
            assert len({out[i][0] for i in pool.members(g)}) == 1
            assert {out[i][1]["game"] for i in pool.members(g)} == {g}
        assert out[0][0] != out[3][0]
        walk = out[3][1]["walkthrough"]
        res = pool.step({3: walk[0], 4: "dance"})
        assert res[3][2] and res[3][4]["won"] and res[4][4]["invalid"]
        assert pool.live() == [0, 1, 2, 4, 5]


def test_a_faulted_restore_retires_the_env_and_rebuilds_it():
    pool = EnvPool("slea/Sokoban-v0", num_groups=1, group_size=2)
    out = pool.reset([3])
    old = pool.envs[1]
    assert pool.set_state(1, {"room": None}) is False  # a snapshot the env cannot take: a fault, not a crash
    assert pool.done[1] and pool.envs[1] is not old and pool.fault_counts["reset_errors"] == 1
    assert pool.set_state(1, pool.get_state(0), last=out[0]) is True
    assert not pool.done[1] and pool.last[1] == out[0]

def test_make_pool_follows_env_workers(monkeypatch):
    import sys

    from slea.config import ConfigError, EnvSection
    from slea.envs.factory import make_pool

    env = EnvSection(id="slea/Sokoban-v0", kwargs={"num_games": 3}, step_timeout_s=5.0)
    with make_pool(env, 2, 2) as pool:
        assert type(pool) is EnvPool and len(pool) == 4 and pool.step_timeout_s == 5.0
        assert pool.envs[0].num_games == 3
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the ray extra were not installed
    with pytest.raises(ConfigError, match=r"env.workers: ray needs the ray package: pip install 'slea\[ray\]'"):
        make_pool(env.model_copy(update={"workers": "ray"}), 2, 2)


def test_eval_env_kwargs_are_the_training_ones_with_the_split_then_eval_kwargs_over_them():
    from slea.config import EnvSection
    from slea.envs.factory import eval_env_kwargs, make_pool

    env = EnvSection(id="slea/Sokoban-v0", kwargs={"num_games": 3, "difficulty": 0.25},
                     eval_kwargs={"num_games": 5})
    assert eval_env_kwargs(env) == {"num_games": 5, "difficulty": 0.25, "split": "heldout"}
    assert eval_env_kwargs(env, "train") == {"num_games": 5, "difficulty": 0.25, "split": "train"}
    # a split named in eval_kwargs wins over the argument; the training kwargs are left as they were
    pinned = env.model_copy(update={"eval_kwargs": {"split": "train"}})
    assert eval_env_kwargs(pinned)["split"] == "train" and env.kwargs == {"num_games": 3, "difficulty": 0.25}
    with make_pool(env, 1, 1, eval_env_kwargs(env)) as pool:
        assert pool.envs[0].split == "heldout" and pool.envs[0].num_games == 5 and pool.envs[0].difficulty == 0.25
