"""RayEnvPool: the same results as the local EnvPool under the same seeds and actions, faults handled the same
way, and a dead worker process survived. One local Ray cluster (2 CPUs) serves the whole module."""

from __future__ import annotations

import math
import time

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (the `ray` extra: pip install 'slea[ray]')")

import slea.envs
import slea.testing.faulty_env  # noqa: F401  (registers slea/test-Faulty-v0 in this process only)
from slea.envs.pool import EnvPool
from slea.envs.ray_pool import RayEnvPool
from slea.testing.faulty_env import FAULTY_ID


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


def _plain(x):
    """Results with NaN made comparable (NaN != NaN) and tuples as lists."""
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def _play(pool: EnvPool, seeds: list[int], turns: int, choose) -> list:
    """Reset with ``seeds``, then ``turns`` batch steps of every live env with ``choose(env, turn, info)``."""
    trace = [pool.reset(seeds)]
    for turn in range(turns):
        live = pool.live()
        if not live:
            break
        trace.append(pool.step({i: choose(i, turn, pool.last[i][1]) for i in live}))
        trace.append(pool.done.tolist())
    return _plain(trace)


def test_textworld_ray_pool_equals_the_local_pool(tw_cache):
    kwargs = {"tasks": tw_cache["tasks"], "num_games": 2, "cache_dir": tw_cache["dir"]}

    def choose(i, turn, info):  # copy 0 of each group follows the walkthrough, the others try admissible moves
        walk = info.get("walkthrough") or []
        if i % 2 == 0 and turn < len(walk):
            return walk[turn]
        cmds = sorted(info.get("admissible_actions") or ["look"])
        return cmds[(i + turn) % len(cmds)]

    with EnvPool("slea/TextWorld-v0", 2, 2, kwargs) as local:
        want = _play(local, [0, 1], 6, choose)
    with RayEnvPool("slea/TextWorld-v0", 2, 2, kwargs, num_workers=2) as remote:
        assert len(remote.workers) == 2 and remote.envs == []  # the copies live in the actors
        got = _play(remote, [0, 1], 6, choose)
        assert remote.instructions.system  # fetched from a worker
    assert got == want
    assert any(r[1] > 0 for step in want[1::2] for r in step.values())  # a walkthrough scored: not a trivial trace
    assert ray.is_initialized()  # the pool did not start this cluster, so it leaves it running


def test_faults_are_handled_and_counted_as_in_the_local_pool():
    kw = {"inner": "slea/Sokoban-v0", "crash_prob": 0.25, "nan_prob": 0.2, "hang_prob": 0.1, "hang_s": 30.0,
          "reset_crash_prob": 0.2}
    guards = {"step_timeout_s": 1.0}

    def choose(i, turn, info):
        return ("up", "down", "left", "right")[(i + turn) % 4]

    seeds = [1, 2, 3]
    local = EnvPool(FAULTY_ID, 3, 2, kw, **guards)
    want = _play(local, seeds, 4, choose)
    want_counts = local.take_fault_stats()
    with RayEnvPool(FAULTY_ID, 3, 2, kw, num_workers=3, **guards) as remote:
        got = _play(remote, seeds, 4, choose)
        got_counts = remote.take_fault_stats()
    assert got == want and got_counts == want_counts
    faults = [r[4]["fault"] for step in want[1::2] for r in step.values() if "fault" in r[4]]
    assert {"error", "timeout"} <= set(faults)  # crashes and a hang both happened, each ended its episode
    assert want_counts["env_errors"] >= 1 and want_counts["env_timeouts"] >= 1 and want_counts["restarts"] >= 2


def _kill(actor) -> None:
    """Kill an actor and wait until it is dead: ``ray.kill`` only asks, and a call sent before the kill lands
    would still be answered (the test then saw a live worker, on a busy machine)."""
    ray.kill(actor)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            pass
        time.sleep(0.05)
    raise AssertionError("the killed worker still answers after 30 s")


def test_a_dead_worker_ends_its_episodes_as_faults_and_is_replaced():
    kw = {"inner": "slea/Sokoban-v0"}
    with RayEnvPool(FAULTY_ID, 2, 2, kw, num_workers=2) as pool:
        pool.reset([5, 6])
        pool.take_fault_stats()
        dead = pool.workers[1]  # holds envs 1 and 3
        _kill(dead)
        res = pool.step({0: "up", 1: "up"})
        assert "fault" not in res[0][4] and not res[0][3]
        obs, reward, term, trunc, info = res[1]
        assert trunc and not term and reward == 0.0 and info["fault"] == "error" and obs == pool.last[1][0]
        assert pool.workers[1] is not dead and "env worker 1 died" in pool.last_error
        res = pool.step({3: "up"})  # env 3's state died with the worker: its episode ends at its next step
        assert res[3][4]["fault"] == "error" and res[3][3]
        stats = pool.take_fault_stats()
        assert stats["env_errors"] == 2 and stats["restarts"] == 2 and stats["calls"] == 3
        out = pool.reset([5, 6])  # the fresh worker plays on
        assert pool.live() == [0, 1, 2, 3] and out[1][0] == out[0][0]
        assert "fault" not in pool.step({1: "up", 3: "up"})[3][4]
