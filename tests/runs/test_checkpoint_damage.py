"""Damaged run folders: a malformed ``state.json`` is a :class:`CheckpointError` before anything is applied, a
checkpoint without a manifest whose weights do not parse is damaged, every command that reads a run's weights says
in one line which damaged newer checkpoint it skips, and ``--checkpoint NAME`` picks one (docs/reliability.md)."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from slea.runs import checkpoint as ckpt


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 3)


def _saved(tmp_path: Path, iterations=(0, 1)):
    net = Net()
    opt = torch.optim.AdamW(net.parameters())
    paths = [ckpt.save_checkpoint(tmp_path, it, net, opt, keep=5) for it in iterations]
    return net, opt, paths


def _rewrite(folder: Path, name: str, data: bytes) -> None:
    """Replace one file and keep the manifest's checksum true (the damage is in the content, not the bytes)."""
    (folder / name).write_bytes(data)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(("edit", "field"), [
    ({"rng": None}, "rng"), ({"iteration": "abc"}, "iteration"), ({"iteration": True}, "iteration"),
    ({"episodes": -3}, "episodes"), ({"wall_s": "NaN"}, "wall_s"), ({"betas": [1, "x"]}, "betas"),
    ({"rng": {"python": [3, [1, 2], None], "numpy": {}}}, "rng.python"),
    ({"rng": "PLACEHOLDER_NUMPY"}, "rng.numpy")])
def test_a_malformed_state_json_is_refused_before_anything_is_applied(tmp_path, edit, field):
    _, _, (path, _) = _saved(tmp_path)
    state = json.loads((path / "state.json").read_text())
    if edit.get("rng") == "PLACEHOLDER_NUMPY":
        edit = {"rng": {**state["rng"], "numpy": {"bit_generator": "MT19937", "state": {"key": [1], "pos": 0}}}}
    _rewrite(path, "state.json", json.dumps({**state, **edit}).encode())
    fresh = Net()
    before = [p.detach().clone() for p in fresh.parameters()]
    py, npy, th = random.getstate(), np.random.get_state(), torch.get_rng_state()
    with pytest.raises(ckpt.CheckpointError, match=f"state.json: {field}"):
        ckpt.load_checkpoint(path, fresh, torch.optim.AdamW(fresh.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(before, fresh.parameters()))  # no weight was copied
    assert random.getstate() == py and torch.equal(torch.get_rng_state(), th)
    assert np.array_equal(np.random.get_state()[1], npy[1])
    if not field.startswith("rng"):  # a command that plays the weights (restoring no RNG) refuses it too
        with pytest.raises(ckpt.CheckpointError, match=f"state.json: {field}"):
            ckpt.check_readable(path)


def test_the_newest_damaged_checkpoint_is_skipped_and_said_in_one_line(tmp_path):
    _, _, (old, new) = _saved(tmp_path / "checkpoints")
    data = (new / "trainable.safetensors").read_bytes()
    (new / "trainable.safetensors").write_bytes(data[: len(data) // 2])  # truncated
    said: list[str] = []
    assert ckpt.run_checkpoint(tmp_path, say=said.append) == old
    assert len(said) == 1 and "\n" not in said[0]
    assert said[0].startswith("skipping damaged checkpoint iter_000001:") and "truncated" in said[0]
    # named: the damaged one is an error (never silently another), the older one is used, an unknown one listed
    with pytest.raises(ckpt.CheckpointError, match="iter_000001"):
        ckpt.run_checkpoint(tmp_path, "iter_000001")
    assert ckpt.run_checkpoint(tmp_path, "iter_000000") == old == ckpt.run_checkpoint(tmp_path, "0")
    with pytest.raises(ckpt.CheckpointError, match=r"no checkpoint '\.\./x' \(checkpoints: iter_000000, iter_000001"):
        ckpt.run_checkpoint(tmp_path, "../x")


def test_without_a_manifest_truncated_weights_are_damaged(tmp_path):
    _, _, (old, new) = _saved(tmp_path / "checkpoints")
    for p in (old, new):
        (p / "manifest.json").unlink()  # a checkpoint from before manifests: nothing to check sums against
    data = (new / "trainable.safetensors").read_bytes()
    (new / "trainable.safetensors").write_bytes(data[:40])
    said: list[str] = []
    assert ckpt.run_checkpoint(tmp_path, say=said.append) == old and "iter_000001" in said[0]
    (old / "trainable.safetensors").write_bytes(b"garbage")
    with pytest.raises(ckpt.CheckpointError, match="has no usable checkpoint"):
        ckpt.run_checkpoint(tmp_path, say=said.append)


# -- the commands, on a real (tiny) run ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A two-iteration tiny run (checkpoints iter_000001 and iter_000002: named by the iterations done) whose
    newest weights are truncated."""
    from slea.testing.tiny_run import tiny_slea_run

    folder = tiny_slea_run(tmp_path_factory.mktemp("damage") / "run", iterations=2)
    newest = ckpt.list_checkpoints(folder / "checkpoints")[-1]
    data = (newest / "trainable.safetensors").read_bytes()
    (newest / "trainable.safetensors").write_bytes(data[: len(data) - 100])
    return folder


def test_export_serve_and_report_say_which_damaged_checkpoint_they_skip(run, tmp_path, slea_cli):
    names = [p.name for p in ckpt.list_checkpoints(run / "checkpoints")]
    assert names == ["iter_000001", "iter_000002"]
    r = slea_cli("export", run, tmp_path / "out")
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("export: skipping damaged checkpoint iter_000002:")
    r = slea_cli("export", run, tmp_path / "out2", "--checkpoint", "iter_000002")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("export: checkpoint") and "iter_000002" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "out2").exists()
    r = slea_cli("report", run, "--out", tmp_path / "report.html")
    assert r.returncode == 0 and "report: skipping damaged checkpoint iter_000002" in r.stderr

    from slea.policy.server import load_engine

    said: list[str] = []
    engine = load_engine(str(run), dtype="float32", say=said.append)
    assert engine.lora == "run" and len(said) == 1 and said[0].startswith("skipping damaged checkpoint iter_000002")
    r = slea_cli("serve", run, "--checkpoint", "iter_000009")
    assert r.returncode == 2 and "no checkpoint 'iter_000009'" in r.stderr and "Traceback" not in r.stderr


def test_eval_of_a_run_whose_state_json_is_malformed_is_one_line_exit_2(run, tmp_path, slea_cli):
    old = ckpt.list_checkpoints(run / "checkpoints")[0]
    state = (old / "state.json").read_bytes()
    manifest = (old / "manifest.json").read_bytes()
    try:
        _rewrite(old, "state.json", json.dumps({**json.loads(state), "iteration": "abc", "rng": None}).encode())
        r = slea_cli("eval", run, "--out", tmp_path / "ev", "--set", "eval.games=1", "--set",
                     "eval.episodes_per_game=1")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert lines[0].startswith("eval: skipping damaged checkpoint iter_000002")
        assert "state.json: iteration" in lines[1] and lines[-1].startswith("eval: run ")
    finally:
        (old / "state.json").write_bytes(state)
        (old / "manifest.json").write_bytes(manifest)


def test_every_trainers_state_json_passes_the_check(tmp_path):
    """What the trainers write is what the check accepts: the RL trainer's counters and seeds, a team run's stage
    number and pending rollouts, an alignment run's stage name."""
    net = Net()
    opt = torch.optim.AdamW(net.parameters())
    extras = [{"episodes": 8, "env_steps": 40, "rollouts": 8, "processes": 1, "critic": None, "bad_update_streak": 0,
               "wall_s": 12.5, "next_env_seeds": [3, 9]},
              {"stage": 2, "position": 1, "updates": 5, "episodes": 4, "messages": 9, "env_steps": 30, "betas": [0.1, 0.2],
               "train_s": 3.0, "agents": ["a", "b"], "wall_s": 7.0, "pending": {"episodes": [], "log_ratio": []}},
              {"stage": "sft"}]
    for i, extra in enumerate(extras):
        path = ckpt.save_checkpoint(tmp_path / str(i), i, net, opt, extra=extra)
        ckpt.check_readable(path)
        assert ckpt.load_checkpoint(path, net, opt)["iteration"] == i
    path = ckpt.save_checkpoint(tmp_path / "bad", 0, net, opt, extra={"stage": 1.5})
    with pytest.raises(ckpt.CheckpointError, match="state.json: stage"):
        ckpt.check_readable(path)


# -- damaged or foreign metadata: skipped in one line, never a traceback -------------------------------------------
def _deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


@pytest.mark.parametrize(("name", "data", "says"), [
    ("manifest.json", b'{"files": {"trainable.safetensors": 1, "state.json": 1, "rng.safetensors": 1}}',
     "manifest.json: files.trainable.safetensors"),
    ("manifest.json", b'{"files": {"trainable.safetensors": {"bytes": "9", "sha256": "ab"}}}', "files.trainable"),
    ("manifest.json", b'["files"]', "manifest.json: Input should be"),
    ("manifest.json", _deep(100_000), "manifest.json nests deeper than 64 levels"),
    ("manifest.json", b'{"files": ' + _deep(200) + b"}", "manifest.json nests deeper than 64 levels"),
    ("state.json", _deep(100_000), "state.json nests deeper than 64 levels"),
    ("state.json", b'{"iteration": 1, "pending": "x"}', "state.json: pending"),
    ("state.json", b"\xff\xfe not utf-8", "state.json is not JSON"),
])
def test_damaged_checkpoint_json_is_skipped_in_one_line_and_the_older_one_used(tmp_path, name, data, says):
    """Before: a manifest of the wrong shape was an AttributeError, a 100 000-deep one a RecursionError, both
    tracebacks in eval, report, serve and export, which all find the checkpoint through run_checkpoint."""
    _, _, (old, new) = _saved(tmp_path / "checkpoints")
    if name == "manifest.json":
        (new / name).write_bytes(data)
    else:  # the manifest kept true: the damage is in what the file says
        _rewrite(new, name, data)
    said: list[str] = []
    assert ckpt.run_checkpoint(tmp_path, say=said.append) == old
    assert len(said) == 1 and "\n" not in said[0] and len(said[0]) < 400, said
    assert said[0].startswith("skipping damaged checkpoint iter_000001:") and says in said[0], said[0]
    fresh = Net()  # resuming: the same skip, the older checkpoint loads
    last, state = ckpt.load_latest(tmp_path / "checkpoints", fresh, torch.optim.AdamW(fresh.parameters()))
    assert last == old and state["iteration"] == 0


def test_a_json_file_past_its_cap_is_refused_before_it_is_read(tmp_path):
    """A 600 MB manifest cost 1.5 GB of memory and 18 s to parse; a sparse one here (no disk used) is refused from
    its size alone."""
    import time

    _, _, (old, new) = _saved(tmp_path / "checkpoints")
    with (new / "manifest.json").open("wb") as fh:
        fh.truncate(600 * 2**20)
    said: list[str] = []
    t0 = time.perf_counter()
    assert ckpt.run_checkpoint(tmp_path, say=said.append) == old
    assert time.perf_counter() - t0 < 2.0
    assert "manifest.json is 600 MiB, more than the 1 MiB such a file may be" in said[0]


def test_a_checkpoint_linked_from_another_run_is_foreign_and_skipped(tmp_path):
    """A checkpoint (or one of its files) that is a link leading out of its run would silently load another run's
    weights, optimizer and RNG states."""
    _, _, (other, _) = _saved(tmp_path / "other" / "checkpoints")
    _, _, (old, new) = _saved(tmp_path / "run" / "checkpoints")
    linked = tmp_path / "run" / "checkpoints" / "iter_000005"
    linked.symlink_to(other, target_is_directory=True)
    said: list[str] = []
    assert ckpt.run_checkpoint(tmp_path / "run", say=said.append) == new
    assert len(said) == 1 and said[0].startswith("skipping damaged checkpoint iter_000005: ")
    assert "is foreign: it leads to" in said[0] and str(other.resolve()) in said[0]
    with pytest.raises(ckpt.CheckpointError, match="is foreign"):
        ckpt.run_checkpoint(tmp_path / "run", "iter_000005")  # named: an error, never silently used
    linked.unlink()
    (new / "trainable.safetensors").unlink()  # a file linked in: foreign too
    (new / "trainable.safetensors").symlink_to(other / "trainable.safetensors")
    said.clear()
    assert ckpt.run_checkpoint(tmp_path / "run", say=said.append) == old
    assert "its trainable.safetensors is a link" in said[0]
    inside = tmp_path / "run" / "checkpoints" / "iter_000007"  # a link within the run is its own checkpoint
    inside.symlink_to(old, target_is_directory=True)
    assert ckpt.run_checkpoint(tmp_path / "run") == inside


def test_report_of_a_run_whose_newest_manifest_is_damaged_says_so_in_one_line(tmp_path, slea_cli):
    from slea.config import dump_config, load_config

    run = tmp_path / "run"
    _, _, (_, new) = _saved(run / "checkpoints")
    (run / "config.yaml").write_text(dump_config(load_config(Path(__file__).parents[2] / "configs" / "smoke.yaml")))
    (new / "manifest.json").write_text('{"files": {"trainable.safetensors": 1}}')
    r = slea_cli("report", run)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("report: skipping damaged checkpoint iter_000001:")
    assert "manifest.json: files.trainable.safetensors" in lines[0]
