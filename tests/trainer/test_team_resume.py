"""A team run killed after single-agent update k and resumed equals the uninterrupted run, bit for bit.

The tiny model on the TeamTR smoke preset, 2 stages × 2 agents = 4 updates, each one checkpointed. The run is
"killed" in process between update k's metrics row and its checkpoint (as tests/reliability/test_resume.py kills
the single-agent trainer), so the resumed run redoes update k from the checkpoint of update k − 1: mid-stage
(k = 1: the checkpoint holds the rollouts the stage's next update learns from) or at a stage boundary (k = 2).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from slea.config import load_config
from slea.runs import checkpoint as ckpt
from slea.runs.runlog import read_metrics
from slea.testing.team_signal import signal_algorithm
from slea.trainer import lifecycle
from slea.trainer.guards import RunHalted
from slea.trainer.team import TeamTrainer

pytest.importorskip("textworld")

ROOT = Path(__file__).resolve().parents[2]
SIGNAL = "test_team_resume_signal"
# A random tiny model never scores, so Eq.9 would give every message advantage 0 and no update would move the
# weights: SIGNAL (an algorithm that needs a team) scores copy 0 of each task +1 and copy 1 −1, so every update
# trains and the comparison can fail.
OVERRIDES = ["rollout.groups=1", "team.max_turns=2", "team.trust_region.min_steps=1", "team.trust_region.max_steps=2",
             "team.trust_region.kl_estimator=k3", "train.iterations=2", "train.lr=0.001", "train.keep_checkpoints=4",
             "run.threads=1", "eval.games=1", "eval.episodes_per_game=2", "eval.before=true",
             f"algorithm.name={SIGNAL}"]
VOLATILE = ("time/",)


class _Killed(Exception):
    pass


@pytest.fixture(scope="module")
def signal():
    with signal_algorithm(SIGNAL):
        yield SIGNAL


def _cfg(mode: str):
    return load_config(ROOT / "configs/teamtr_smoke.yaml", [*OVERRIDES, f"team.rollouts={mode}"])


@pytest.fixture(scope="module")
def reference(signal, tmp_path_factory):
    """One uninterrupted run per ``team.rollouts`` mode, made on first use."""
    runs: dict[str, Path] = {}

    def get(mode: str) -> Path:
        if mode not in runs:
            runs[mode] = tmp_path_factory.mktemp(f"ref-{mode}")
            TeamTrainer(_cfg(mode), runs[mode]).fit()
        return runs[mode]

    return get


def _rows(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in read_metrics(run / "metrics.jsonl")]


def _adapters(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(ckpt.latest_checkpoint(run / "checkpoints") / "trainable.safetensors"))


@pytest.mark.parametrize("mode,k", [("fresh", 1), ("fresh", 2), ("stale_iw", 1)])
def test_killed_after_update_k_then_resumed_equals_uninterrupted(tmp_path, reference, mode, k, caplog):
    ref = reference(mode)
    want = _adapters(ref)
    assert any(bool(t.abs().max() > 0) for n, t in want.items() if "lora_B" in n), "nothing trained"

    run = tmp_path / "run"
    victim = TeamTrainer(_cfg(mode), run)
    real_log = victim.log.log

    def log_then_die(update, row):
        real_log(update, row)
        if update == k:  # update k's row is written, its checkpoint is not
            raise _Killed

    victim.log.log = log_then_die
    with pytest.raises(_Killed):
        victim.fit()
    victim.close()
    assert [r["iteration"] for r in read_metrics(run / "metrics.jsonl")] == list(range(k + 1))
    assert ckpt.latest_checkpoint(run / "checkpoints").name == f"iter_{k:06d}"  # named by the updates done: k
    state = json.loads((ckpt.latest_checkpoint(run / "checkpoints") / "state.json").read_text())
    assert (state["pending"] is None) == (k == 2)  # mid-stage checkpoints keep the next update's rollouts

    resumed = TeamTrainer(_cfg(mode), run)
    t0 = time.perf_counter()
    with caplog.at_level("INFO", logger="slea"):
        summary = resumed.fit(resume=True)
    this_process = time.perf_counter() - t0
    assert any(f"(checkpoints/iter_{k:06d}); " in r.getMessage() for r in caplog.records)
    # the wall time counts the killed process up to its checkpoint too, not only the resumed fit
    assert state["wall_s"] > 0 and summary["wall_s"] > this_process
    assert summary["wall_s"] == pytest.approx(state["wall_s"] + this_process, abs=this_process)

    assert _rows(run) == _rows(ref)  # every metric of every update, β and token KL included
    got = _adapters(run)
    # bit-exact: case 1 of slea.testing.numerics, both runs on this machine (the same CPU kind, the same thread
    # count); another ISA or thread count reduces in another order
    assert got.keys() == want.keys() and all(torch.equal(got[n], want[n]) for n in want)
    for name in ("planner", "actor"):  # the adapters/ copy of the last stage too
        a, b = (load_file(str(d / "adapters" / f"{name}.safetensors")) for d in (run, ref))
        assert all(torch.equal(a[n], b[n]) for n in b)
    ref_summary = json.loads((ref / "eval/summary.json").read_text())
    for key in ("updates", "episodes", "messages", "iterations"):
        assert summary[key] == ref_summary[key], key
    for key in ("sampled", "per_game_wins"):
        assert summary["after"][key] == ref_summary["after"][key]
    assert summary["before"]["sampled"] == ref_summary["before"]["sampled"]  # carried over from the killed run


def test_resume_without_a_checkpoint_starts_over_and_with_only_damaged_ones_refuses(tmp_path, signal):
    tr = TeamTrainer(_cfg("fresh"), tmp_path)
    tr.log.log(0, {"x": 1.0})  # killed before its first checkpoint
    assert not tr.resume() and read_metrics(tmp_path / "metrics.jsonl") == []
    tr.updates = 1
    tr.log.log(0, {"x": 1.0})
    lifecycle.save(tr, 0)
    path = ckpt.latest_checkpoint(tmp_path / "checkpoints")
    (path / "trainable.safetensors").write_bytes(b"garbage")
    tr.log.log(1, {"x": 2.0})
    with pytest.raises(RunHalted, match="no checkpoint .* loads"):
        tr.resume()
    assert [r["iteration"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1]  # nothing changed
    tr.close()


def test_optimizer_set_round_trips_every_agents_moments(tmp_path):
    nets = [torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)]
    opts = [torch.optim.AdamW(n.parameters(), lr=0.1) for n in nets]
    for net, opt in zip(nets, opts):
        net(torch.ones(1, net.in_features)).sum().backward()
        opt.step()
    opts[0].step()  # a second step for agent 0 only: the step counts differ
    weights = {f"{j}.{n}": p for j, net in enumerate(nets) for n, p in net.named_parameters()}
    path = ckpt.save_checkpoint(tmp_path, 0, weights, ckpt.OptimizerSet(opts))
    fresh = [torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)]
    fresh_opts = [torch.optim.AdamW(n.parameters(), lr=0.1) for n in fresh]
    ckpt.load_checkpoint(path, {f"{j}.{n}": p for j, net in enumerate(fresh) for n, p in net.named_parameters()},
                         ckpt.OptimizerSet(fresh_opts))
    for a, b in zip(opts, fresh_opts):
        sa, sb = a.state_dict()["state"], b.state_dict()["state"]
        assert sa.keys() == sb.keys()
        for i in sa:
            assert all(torch.equal(torch.as_tensor(sa[i][key]), torch.as_tensor(sb[i][key])) for key in sa[i])
    assert float(fresh_opts[0].state_dict()["state"][0]["step"]) == 2.0
    assert float(fresh_opts[1].state_dict()["state"][0]["step"]) == 1.0
    assert all(torch.equal(p, q) for net, f in zip(nets, fresh) for p, q in zip(net.parameters(), f.parameters()))
    # a mapping is loaded whole: a checkpoint without one of its tensors (an agent's adapter) is refused
    extra = {**weights, "2.weight": torch.nn.Parameter(torch.zeros(1))}
    with pytest.raises(ckpt.CheckpointError, match="lacks weights, e.g. 2.weight"):
        ckpt.load_checkpoint(path, extra)


def test_a_stage_s_adapters_with_nan_weights_are_never_written(tmp_path, signal):
    trainer = TeamTrainer(_cfg("fresh"), tmp_path)
    trainer.write_adapters()  # finite weights: one file per agent
    written = sorted(p.name for p in (tmp_path / "adapters").iterdir())
    assert written
    good = {p.name: p.read_bytes() for p in (tmp_path / "adapters").iterdir()}
    with torch.no_grad():
        next(iter(trainer.weights.values())).fill_(float("nan"))
    with pytest.raises(RunHalted, match="the stage's adapters"):
        trainer.write_adapters()
    assert {p.name: p.read_bytes() for p in (tmp_path / "adapters").iterdir()} == good  # the good ones are kept
