"""DAPO dynamic sampling: flat groups are dropped and refilled so the trained batch keeps its size."""

import numpy as np

from slea.rollout.collector import RolloutStats
from slea.rollout.sampling import collect_batch, refill_seeds, zero_variance_groups
from slea.types import Step, Trajectory


class FakePool:
    def __init__(self, groups, group_size):
        self.groups, self.group_size = groups, group_size

    def __len__(self):
        return self.groups * self.group_size


class FakeCollector:
    """Group g of a call gets returns that vary across its copies iff ``seed % 3 == 0`` (a third have signal)."""

    def __init__(self):
        self.calls = []

    def collect(self, pool, seeds, *, iteration=0, traj_offset=0, progress=None):
        self.calls.append(list(seeds))
        trajs = []
        for g, seed in enumerate(seeds):
            for c in range(pool.group_size):
                i = g * pool.group_size + c
                r = float(c % 2) if seed % 3 == 0 else 0.0
                t = Trajectory(group_id=g, traj_id=traj_offset + i, seed=seed)
                t.steps = [Step(g, traj_offset + i, k, "obs", [1], [2], [-0.1], reward=r if k == 1 else 0.0)
                           for k in range(2)]
                trajs.append(t)
        return trajs, RolloutStats(gen_s=1.0, prompt_tokens=10 * len(trajs), parse_kinds={"exact": len(trajs)})


def seeds_with_signal(n_signal, n_flat):
    return [3 * k for k in range(1, n_signal + 1)] + [3 * k + 1 for k in range(n_flat)]


def test_off_is_one_plain_collection():
    col, pool = FakeCollector(), FakePool(4, 2)
    b = collect_batch(col, pool, seeds_with_signal(1, 3), iteration=0, run_seed=0, dynamic=False,
                      max_refill_rounds=5)
    assert len(col.calls) == 1 and b.trajs is b.collected and len(b.trajs) == 8 and b.metrics == {}
    assert b.env_steps == 16


def test_dynamic_sampling_keeps_the_batch_size():
    col, pool = FakeCollector(), FakePool(4, 2)
    b = collect_batch(col, pool, seeds_with_signal(1, 3), iteration=7, run_seed=1, dynamic=True,
                      max_refill_rounds=50)
    groups = {t.group_id for t in b.trajs}
    assert len(groups) == 4  # the batch has 4 groups again, every one with signal
    assert not zero_variance_groups(b.trajs)
    assert len(b.trajs) == 8
    rounds = int(b.metrics["sampling/refill_rounds"])
    assert rounds >= 1 and len(col.calls) == rounds + 1
    assert col.calls[1] == refill_seeds(1, 7, 1, 4)  # fresh, reproducible seeds
    assert b.metrics["sampling/kept_groups"] == 4 and b.metrics["sampling/short_groups"] == 0
    assert b.metrics["sampling/refilled_groups"] == 3
    n_flat = b.metrics["sampling/dropped_groups"]
    assert n_flat + 4 + b.metrics["sampling/surplus_groups"] == 4 * (rounds + 1)
    # every episode played is counted; ids stay unique across rounds; steps carry their trajectory's group
    assert len(b.collected) == 8 * (rounds + 1) and b.env_steps == 2 * len(b.collected)
    assert len({(t.group_id, t.traj_id) for t in b.collected}) == len(b.collected)
    assert all(s.group_id == t.group_id for t in b.collected for s in t.steps)
    assert b.stats.gen_s == rounds + 1 and b.stats.parse_kinds["exact"] == len(b.collected)


def test_refill_is_bounded():
    class Flat(FakeCollector):
        def collect(self, pool, seeds, **kw):
            return super().collect(pool, [3 * s + 1 for s in range(len(seeds))], **kw)

    col = Flat()
    b = collect_batch(col, FakePool(2, 3), [1, 4], iteration=0, run_seed=0, dynamic=True, max_refill_rounds=2)
    assert len(col.calls) == 3 and b.trajs == []
    assert b.metrics["sampling/short_groups"] == 2 and b.metrics["sampling/dropped_groups"] == 6


def test_refill_seeds_differ_from_round_zero():
    from slea.rollout.sampling import iteration_seeds

    s0 = iteration_seeds(3, 5, 8)
    s1, s2 = refill_seeds(3, 5, 1, 8), refill_seeds(3, 5, 2, 8)
    assert len({*s0, *s1, *s2}) == 24 and s1 == refill_seeds(3, 5, 1, 8)
    assert np.all(np.array(s1) >= 0)


def test_merged_shards_number_groups_and_trajectories_as_one_process():
    from slea.rollout.sampling import merge_shards

    seeds = [10, 11, 12, 13, 14]  # 5 groups x 2 copies; ranks play groups 0-1 and 2-4
    whole = collect_batch(FakeCollector(), FakePool(5, 2), seeds, iteration=0, run_seed=0, dynamic=False,
                          max_refill_rounds=0)
    parts = [collect_batch(FakeCollector(), FakePool(n, 2), part, iteration=0, run_seed=0, dynamic=False,
                           max_refill_rounds=0) for n, part in ((2, seeds[:2]), (3, seeds[2:]))]
    merged = merge_shards(parts)
    key = [(t.group_id, t.traj_id, t.seed, [(s.group_id, s.traj_id) for s in t.steps]) for t in merged.trajs]
    assert key == [(t.group_id, t.traj_id, t.seed, [(s.group_id, s.traj_id) for s in t.steps]) for t in whole.trajs]
    assert merged.collected == merged.trajs and len(merged.trajs) == 10
    assert merged.stats.prompt_tokens == 10 * 4 + 10 * 6 and merged.stats.parse_kinds == {"exact": 10}  # summed
