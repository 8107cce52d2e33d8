"""episodes.jsonl: the sample of episodes a run records for ``slea report`` (slea/runs/episodes.py)."""

from __future__ import annotations

import json

import numpy as np

from slea.algorithms.batch import Advantages
from slea.experience.library import ExperienceLibrary
from slea.runs.episodes import EpisodeSampler, choose, read_episodes
from slea.types import Step, Trajectory


def _traj(traj_id: int, rewards: list[float], won: bool, exp_ids=(), obs="x" * 50) -> Trajectory:
    steps = [Step(group_id=0, traj_id=traj_id, step=k, anchor=f"{obs} {k}", prompt_ids=[1], response_ids=[2],
                  old_logprobs=[-1.0], reward=r, action=f"go {k}", response_text=f"go {k}", cluster_id=k,
                  experience_ids=list(exp_ids)) for k, r in enumerate(rewards)]
    return Trajectory(group_id=0, traj_id=traj_id, goal="win", task_type="t", seed=7, steps=steps, won=won)


def test_choose_alternates_wins_and_losses_and_prefers_source_episodes():
    trajs = [_traj(0, [0.0], False), _traj(1, [1.0], True), _traj(2, [0.5, 1.0], True), _traj(3, [-1.0], False)]
    assert choose(trajs, 4) == [2, 3, 1, 0]  # best win, worst loss, next win, next loss
    assert choose(trajs, 2, preferred={1, 0}) == [1, 0]
    assert choose(trajs, 3, preferred=set()) == [2, 3, 1]
    assert choose([t for t in trajs if not t.won], 3) == [1, 0]  # only losses: as many as there are


def test_record_aligns_advantages_with_steps_and_keeps_retrieved_texts(tmp_path):
    lib = ExperienceLibrary(tmp_path / "lib.sqlite")
    eid = lib.add("Push the box toward the target.", "pos", "pattern", 1.0, sources=[1], iteration=0).entry_id

    class Manager:  # what the sampler reads of an ExperienceManager
        library = lib

    trajs = [_traj(0, [0.0, 0.0], False, exp_ids=[eid], obs="y" * 2000), _traj(1, [1.0], True)]
    adv = Advantages(rows=np.array([-0.5, float("nan"), 1.5]))
    s = EpisodeSampler(tmp_path, per_iteration=4, max_bytes=10**6)
    assert s.record(0, trajs, adv, Manager()) == 2
    rows = read_episodes(tmp_path / "episodes.jsonl")
    win, loss = rows
    assert win["traj"] == 1 and win["won"] and win["sourced"] == [eid]
    assert [st["advantage"] for st in win["steps"]] == [1.5]
    assert [st["advantage"] for st in loss["steps"]] == [-0.5, None]  # NaN is not JSON: None
    assert loss["steps"][0]["experiences"] == [{"id": eid, "zone": "pos", "text": "Push the box toward the target."}]
    assert len(loss["steps"][0]["obs"]) <= 600 and loss["steps"][1]["cluster"] == 1
    lib.close()


def test_per_iteration_count_spans_rounds_and_the_byte_budget_stops_rows(tmp_path):
    trajs = [_traj(i, [float(i % 2)], bool(i % 2)) for i in range(6)]
    s = EpisodeSampler(tmp_path, per_iteration=3, max_bytes=10**6)
    assert s.record(0, trajs, None) == 3
    assert s.record(0, trajs, None) == 0  # a second round of the same iteration: its share is taken
    assert s.record(1, trajs[:2], None) == 2 and s.record(1, trajs, None) == 1
    size = (tmp_path / "episodes.jsonl").stat().st_size
    small = EpisodeSampler(tmp_path / "b", per_iteration=3, max_bytes=size // 3)
    (tmp_path / "b").mkdir()
    assert small.record(0, trajs, None) < 3
    assert (tmp_path / "b" / "episodes.jsonl").stat().st_size <= size // 3
    assert EpisodeSampler(tmp_path / "c", per_iteration=0, max_bytes=10).record(0, trajs, None) == 0


def test_truncate_drops_rows_past_the_resumed_iteration(tmp_path):
    s = EpisodeSampler(tmp_path, per_iteration=1, max_bytes=10**6)
    for it in range(4):
        s.record(it, [_traj(0, [1.0], True)], None)
    (tmp_path / "episodes.jsonl").open("a").write('{"torn": \n')
    s.truncate(1)
    assert [r["iteration"] for r in read_episodes(tmp_path / "episodes.jsonl")] == [0, 1]
    assert s.record(2, [_traj(0, [1.0], True)], None) == 1  # the redone iteration records again


def test_a_tiny_slea_run_records_episodes_that_link_to_its_library(tmp_path):
    from slea.testing.tiny_run import tiny_slea_run

    run = tiny_slea_run(tmp_path / "run", episode_samples=3)
    rows = read_episodes(run / "episodes.jsonl")
    assert [r["iteration"] for r in rows] == [0, 0, 0, 1, 1, 1]
    assert all(st["advantage"] is not None for r in rows for st in r["steps"])
    lib = ExperienceLibrary(run / "library.sqlite")
    ids = {e.id for e in lib.entries()}
    lib.conn.close()
    sourced = {i for r in rows for i in r["sourced"]}
    assert sourced & ids  # entries created from recorded episodes are named (some may be replaced later)
    used = {e["id"] for r in rows for st in r["steps"] for e in st["experiences"]}
    assert used, "iteration 1 retrieves (warm-up 0)"
    json.dumps(rows)  # plain JSON throughout


def test_a_resumed_run_records_the_same_episodes_as_an_uninterrupted_one(tmp_path):
    from slea.testing.tiny_run import tiny_slea_config, tiny_slea_run
    from slea.trainer.rl import Trainer

    whole = read_episodes(tiny_slea_run(tmp_path / "whole", iterations=2) / "episodes.jsonl")
    run = tiny_slea_run(tmp_path / "cut", iterations=1)
    with (run / "episodes.jsonl").open("a") as fh:  # what a killed run logged past its last checkpoint
        fh.write(json.dumps({"iteration": 1, "steps": []}) + "\n")
    t = Trainer(tiny_slea_config(run, iterations=2))
    assert t.resume() and t.state.first_step == 1
    assert {r["iteration"] for r in read_episodes(run / "episodes.jsonl")} == {0}  # the stray row is gone
    t.fit(resume=True)
    assert read_episodes(run / "episodes.jsonl") == whole
