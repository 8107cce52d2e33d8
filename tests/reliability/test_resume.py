"""Exact resume and crash-safe state: kill anywhere, resume, get the uninterrupted run's numbers.

* in process (fast): a run "killed" between an iteration's metrics row and its checkpoint, resumed by a new
  Trainer, equals an uninterrupted run metric by metric — with the experience library on, so the library is
  restored to the checkpoint's snapshot (the killed iteration had already committed into it);
* checkpoint validation: damaged, truncated, half-written or non-finite checkpoints are skipped with a
  warning and the previous one is used; nothing is applied from a checkpoint that fails to load;
* metrics truncation and library restore are atomic;
* slow: ``slea train`` on the smoke preset SIGKILLed at a fixed moment (inside iteration 1's checkpoint, its files
  written, not yet renamed into place), resumed with ``slea train --resume``, equals an uninterrupted run
  (metrics, final weights that training changed, held-out eval).

Every "equals" here is bitwise (case 1 of slea.testing.numerics): both runs compute on this machine, with the
same CPU kind and the same thread count. A run resumed on another CPU kind or with another ``run.threads`` reduces
in another order and is not expected to match bit for bit.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from slea.runs import checkpoint as ckpt
from slea.runs.runlog import read_metrics, truncate_metrics

ROOT = Path(__file__).resolve().parents[2]


class _Killed(Exception):
    pass


def _library_rows(path: Path) -> list[tuple]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        rows = []
        for t in tables:
            rows += [(t, *r) for r in con.execute(f'SELECT * FROM "{t}" ORDER BY 1')]
        return rows
    finally:
        con.close()


def _final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(ckpt.latest_checkpoint(run / "checkpoints") / "trainable.safetensors"))


def test_killed_in_process_then_resumed_equals_uninterrupted(tmp_path, rel, caplog):
    from slea.trainer.rl import Trainer

    cfg = rel.tiny_config(train={"iterations": 4},
                          experience={"mode": "step", "warmup_iters": 1, "min_entries": 1})
    ref = Trainer(cfg, run_dir=tmp_path / "ref")
    ref.fit()

    run = tmp_path / "run"
    victim = Trainer(cfg, run_dir=run)
    real_log = victim.log.log

    def log_then_die(it, metrics):
        real_log(it, metrics)
        if it == 2:  # the row of iteration 2 is written, its checkpoint is not
            raise _Killed

    victim.log.log = log_then_die
    with pytest.raises(_Killed):
        victim.fit()
    victim.experience.library.conn.close()  # as a kill would: no clean shutdown, no extra writes
    victim.log.close()
    assert [r["iteration"] for r in read_metrics(run / "metrics.jsonl")] == [0, 1, 2]
    assert ckpt.latest_checkpoint(run / "checkpoints").name == "iter_000002"  # iteration 2, as the log counts

    saved = json.loads((run / "checkpoints/iter_000002/state.json").read_text())["wall_s"]
    resumed = Trainer(cfg, run_dir=run)
    t0 = time.perf_counter()
    with caplog.at_level("INFO", logger="slea"):
        summary = resumed.fit(resume=True)
    this_process = time.perf_counter() - t0
    messages = [r.getMessage() for r in caplog.records]
    assert "resumed after iteration 2/4 (checkpoints/iter_000002); continuing with iteration 3/4" in messages, messages
    # the wall time counts the killed process up to its checkpoint too, not only the resumed fit
    assert saved > 0 and summary["wall_s"] > this_process
    assert summary["wall_s"] == pytest.approx(saved + this_process, abs=this_process)

    rel.assert_same_metrics(read_metrics(run / "metrics.jsonl"), read_metrics(tmp_path / "ref/metrics.jsonl"))
    assert _library_rows(run / "library.sqlite") == _library_rows(tmp_path / "ref/library.sqlite")
    got, want = _final_weights(run), _final_weights(tmp_path / "ref")
    assert _trained(want), "the reference run never changed its weights: the comparison would prove nothing"
    # bit-exact: the same CPU kind and thread count on both sides (case 1, module docstring)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    a = json.loads((run / "eval/after.json").read_text())
    b = json.loads((tmp_path / "ref/eval/after.json").read_text())
    assert a["sampled"] == b["sampled"]


def test_resume_without_a_checkpoint_starts_over_and_with_only_damaged_ones_refuses(tmp_path, rel):
    from slea.trainer.guards import RunHalted
    from slea.trainer.rl import Trainer

    cfg = rel.tiny_config(experience={"mode": "step"})
    trainer = Trainer(cfg, run_dir=tmp_path)
    trainer.log.log(0, {"x": 1.0})  # a run killed before its first checkpoint
    assert not trainer.resume() and read_metrics(tmp_path / "metrics.jsonl") == []
    assert trainer.state.first_step == 0
    trainer.log.log(0, {"x": 1.0})
    path = ckpt.save_checkpoint(tmp_path / "checkpoints", 0, trainer.model, trainer.optimizer)
    (path / "trainable.safetensors").write_bytes(b"garbage")
    trainer.log.log(1, {"x": 2.0})
    with pytest.raises(RunHalted, match="no checkpoint .* loads"):
        trainer.resume()  # the only checkpoint is damaged: refuse rather than wipe the run
    assert [r["iteration"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1]


# -- checkpoint validation ---------------------------------------------------------------------------------
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 3)


def _net_opt(seed=0):
    torch.manual_seed(seed)
    net = Net()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    net.a(torch.randn(2, 4)).sum().backward()
    opt.step()
    return net, opt


def _three_checkpoints(root: Path) -> list[Path]:
    paths = []
    for it in range(3):
        net, opt = _net_opt(seed=it)
        paths.append(ckpt.save_checkpoint(root, it, net, opt, keep=3))
    return paths


def _damage(path: Path, how: str) -> None:
    f = path / "trainable.safetensors"
    if how == "flip":
        data = bytearray(f.read_bytes())
        data[-3] ^= 0xFF
        f.write_bytes(bytes(data))
    elif how == "truncate":
        f.write_bytes(f.read_bytes()[:20])
    elif how == "delete":
        f.unlink()
    elif how == "manifest":
        (path / "manifest.json").write_text("{\"files\": ")
    elif how == "state":
        (path / "state.json").write_text("{\"iteration\": ")
    elif how == "empty_optimizer":
        (path / "optimizer.safetensors").write_bytes(b"")


@pytest.mark.parametrize("how", ["flip", "truncate", "delete", "manifest", "state", "empty_optimizer"])
def test_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path, how, caplog):
    paths = _three_checkpoints(tmp_path)
    _damage(paths[2], how)
    net, opt = _net_opt(seed=9)
    before = net.a.weight.detach().clone()
    with pytest.raises(ckpt.CheckpointError):
        ckpt.load_checkpoint(paths[2], net, opt)
    assert torch.equal(net.a.weight, before)  # nothing applied from a checkpoint that fails
    with caplog.at_level("WARNING", logger="slea"):
        path, state = ckpt.load_latest(tmp_path, net, opt)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert path == paths[1] and state["iteration"] == 1
    assert len(warnings) == 1 and "iter_000002" in warnings[0]
    ref, _ = _net_opt(seed=1)
    assert torch.equal(net.a.weight, ref.a.weight)
    assert ckpt.latest_checkpoint(tmp_path) == paths[1]


def test_half_written_and_pruned_leftovers_are_ignored(tmp_path):
    paths = _three_checkpoints(tmp_path)
    for name in (".tmp-iter_000003", ".old-iter_000002", ".del-iter_000000"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "state.json").write_text("{}")
    (tmp_path / "iter_000004").mkdir()  # no state.json: a folder someone made by hand
    assert ckpt.latest_checkpoint(tmp_path) == paths[2]
    net, opt = _net_opt(seed=5)
    assert ckpt.load_latest(tmp_path, net, opt)[0] == paths[2]


def test_no_intact_checkpoint_gives_none(tmp_path, caplog):
    paths = _three_checkpoints(tmp_path)
    for p in paths:
        _damage(p, "flip")
    net, opt = _net_opt()
    with caplog.at_level("WARNING", logger="slea"):
        assert ckpt.load_latest(tmp_path, net, opt) == (None, None)
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 3


def test_non_finite_or_misshapen_weights_are_refused(tmp_path):
    net, opt = _net_opt()
    with torch.no_grad():
        net.a.weight[0, 0] = float("nan")
    path = ckpt.save_checkpoint(tmp_path, 0, net, opt)
    fresh, fresh_opt = _net_opt()
    with pytest.raises(ckpt.CheckpointError, match="non-finite"):
        ckpt.load_checkpoint(path, fresh, fresh_opt)

    class Wider(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(5, 3)

    net, opt = _net_opt()
    path = ckpt.save_checkpoint(tmp_path, 1, net, opt)
    with pytest.raises(ckpt.CheckpointError, match="shape"):
        ckpt.load_checkpoint(path, Wider())


def test_legacy_checkpoint_without_manifest_still_loads(tmp_path):
    net, opt = _net_opt(seed=3)
    path = ckpt.save_checkpoint(tmp_path, 0, net, opt)
    (path / "manifest.json").unlink()
    fresh, fresh_opt = _net_opt(seed=4)
    assert ckpt.load_checkpoint(path, fresh, fresh_opt)["iteration"] == 0
    assert torch.equal(fresh.a.weight, net.a.weight)


def test_resaving_an_iteration_replaces_it_atomically(tmp_path):
    net, opt = _net_opt(seed=1)
    ckpt.save_checkpoint(tmp_path, 0, net, opt)
    net2, opt2 = _net_opt(seed=2)
    path = ckpt.save_checkpoint(tmp_path, 0, net2, opt2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_000000"]
    fresh, _ = _net_opt(seed=7)
    ckpt.load_checkpoint(path, fresh)
    assert torch.equal(fresh.a.weight, net2.a.weight)


# -- metrics and library ------------------------------------------------------------------------------------
def test_truncate_metrics_drops_later_and_torn_rows_atomically(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"iteration": i, "x": i}) + "\n" for i in range(4)) + '{"iteration": 4, "x')
    truncate_metrics(path, 1)
    assert [r["iteration"] for r in read_metrics(path)] == [0, 1]
    truncate_metrics(path, -1)  # resumed without any checkpoint: every row goes
    assert path.read_text() == "" and not list(tmp_path.glob(".*tmp"))


def test_library_snapshot_and_restore_undo_later_commits(tmp_path):
    db = tmp_path / "library.sqlite"
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE entries (id INTEGER PRIMARY KEY, text TEXT)")
    con.executemany("INSERT INTO entries (text) VALUES (?)", [("a",), ("b",)])
    net, opt = _net_opt()
    path = ckpt.save_checkpoint(tmp_path / "checkpoints", 0, net, opt, library=db)
    con.execute("INSERT INTO entries (text) VALUES ('after the checkpoint')")  # lives in the WAL
    con.close()
    assert [r[0] for r in sqlite3.connect(db).execute("SELECT text FROM entries")][-1] == "after the checkpoint"
    Path(f"{db}-wal").write_bytes(b"stale journal")  # must not be replayed onto the restored file
    assert ckpt.restore_library(path, db)
    assert not Path(f"{db}-wal").exists()
    assert [r[0] for r in sqlite3.connect(db).execute("SELECT text FROM entries")] == ["a", "b"]
    assert not ckpt.restore_library(None, db) and not db.exists()  # resumed from scratch: empty library


# -- the real thing: SIGKILL a `slea train` process -----------------------------------------------------------
def _slea(*args: str) -> list[str]:
    return [sys.executable, "-m", "slea.cli", *args]


# only the final evaluation is compared, so none runs before training; each test sets how many iterations it needs
SMOKE_OVERRIDES = ["--set", "rollout.fuzzy_cutoff=0.3", "--set", "eval.greedy=false", "--set", "eval.before=false",
                   "--set", "eval.games=1", "--set", "eval.episodes_per_game=2"]


# The killed run imports slea.testing.kill_checkpoint (``plugins: [...]``): armed by $SLEA_TEST_KILL_AT only, it
# SIGKILLs the process inside iteration 1's checkpoint after every file of it is written and before it is renamed
# into place (so a half-done ``.tmp-iter_000001`` is left behind); the resumed process (same config) runs on.


def test_a_stop_asked_mid_iteration_checkpoints_it_and_the_resumed_run_equals_uninterrupted(tmp_path, rel):
    """What Ctrl-C does in `slea train` (slea/trainer/interrupt.py), in process: the stop is asked while iteration
    2 of 4 runs; that iteration is finished, logged and checkpointed (although save_every is 3), the run stops
    with :class:`Interrupted`, and the resumed run gives the uninterrupted run's metrics, weights and evaluation."""
    from slea.cli.runs import interrupted_lines
    from slea.trainer.interrupt import Interrupted
    from slea.trainer.rl import Trainer

    cfg = rel.tiny_config(train={"iterations": 4, "save_every": 3}, eval={"before": True})
    Trainer(cfg, run_dir=tmp_path / "ref").fit()
    run = tmp_path / "run"
    victim = Trainer(cfg, run_dir=run)
    real_iteration = victim.iteration

    def ctrl_c_during(it):
        if it == 1:
            victim.stop.requested = "SIGINT"  # as the handler does on the first Ctrl-C
        return real_iteration(it)

    victim.iteration = ctrl_c_during
    with pytest.raises(Interrupted) as got:
        victim.fit()
    victim.close()
    assert got.value.where == "iteration 2/4" and got.value.exit_code == 130
    assert [p.name for p in ckpt.list_checkpoints(run / "checkpoints")] == ["iter_000002"]
    assert [r["iteration"] for r in read_metrics(run / "metrics.jsonl")] == [0, 1]
    assert (run / "curves.png").is_file() and not (run / "eval/summary.json").exists()
    assert interrupted_lines(victim, got.value) == [
        "Ctrl-C: stopped after iteration 2/4",
        f"last checkpoint: iteration 2/4 ({run / 'checkpoints' / 'iter_000002'})",
        f"resume with: slea train --resume {run}"]
    summary = Trainer(cfg, run_dir=run).fit(resume=True)
    assert summary["before"] is not None  # the untrained row, read back from eval/before.json
    rel.assert_same_metrics(read_metrics(run / "metrics.jsonl"), read_metrics(tmp_path / "ref/metrics.jsonl"))
    got_w, want = _final_weights(run), _final_weights(tmp_path / "ref")
    assert _trained(want) and got_w.keys() == want.keys() and all(torch.equal(got_w[k], want[k]) for k in want)
    for name in ("before", "after"):
        a = json.loads((run / f"eval/{name}.json").read_text())
        b = json.loads((tmp_path / f"ref/eval/{name}.json").read_text())
        assert a["sampled"] == b["sampled"], name


def test_a_stop_asked_before_the_first_iteration_says_there_is_nothing_to_resume_from(tmp_path, rel):
    from slea.cli.runs import interrupted_lines
    from slea.trainer.interrupt import Interrupted
    from slea.trainer.rl import Trainer

    run = tmp_path / "run"
    tr = Trainer(rel.tiny_config(eval={"before": True}), run_dir=run)
    real_evaluate = tr.evaluate

    def ctrl_c_in(name):  # during the evaluation before training
        tr.stop.requested = "SIGTERM"
        return real_evaluate(name)

    tr.evaluate = ctrl_c_in
    with pytest.raises(Interrupted) as got:
        tr.fit()
    tr.close()
    assert got.value.exit_code == 143 and not ckpt.list_checkpoints(run / "checkpoints")
    assert (run / "eval/before.json").is_file() and not read_metrics(run / "metrics.jsonl")
    assert interrupted_lines(tr, got.value) == ["SIGTERM: stopped before the first training step",
                                                "no checkpoint yet: resuming starts the run from its beginning",
                                                f"resume with: slea train --resume {run}"]


def test_the_signal_handler_asks_once_then_abandons(caplog):
    """The first SIGINT (or SIGTERM) asks the run to stop after the step in progress and says so; the second
    abandons that step (KeyboardInterrupt); the previous handlers are back after the block."""
    from slea.trainer.interrupt import StopSignal

    stop = StopSignal()
    stop.doing = "iteration 3/8"
    before = signal.getsignal(signal.SIGINT)
    with caplog.at_level("WARNING", logger="slea"), stop.installed():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs between bytecodes of this thread
        assert stop.requested == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
    assert signal.getsignal(signal.SIGINT) is before
    assert [r.getMessage() for r in caplog.records] == [
        "SIGTERM: stopping after iteration 3/8, which is then checkpointed (Ctrl-C again abandons it)"]


def _trained(weights: dict[str, torch.Tensor]) -> bool:
    """LoRA's B matrices start at exactly 0: any non-zero entry means the updates changed the weights."""
    bs = [t for k, t in weights.items() if "lora_B" in k]
    return bool(bs) and any(bool(t.abs().max() > 0) for t in bs)


@pytest.mark.slow
def test_sigkill_then_resume_equals_uninterrupted_smoke_run(tmp_path, rel, slea_cli):
    pytest.importorskip("textworld")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    env.pop("SLEA_TEST_KILL_AT", None)
    smoke = str(ROOT / "configs/smoke.yaml")
    # 2 iterations: the kill inside iteration 2's checkpoint, then the resumed process re-runs iteration 2 from
    # iteration 1's checkpoint (its bit-exact weights need the optimizer and random states that checkpoint restores);
    # a resumed process going on past the iteration it re-ran is the SIGINT test's
    over = [*SMOKE_OVERRIDES, "--set", "train.iterations=2", "--set", "plugins=[slea.testing.kill_checkpoint]"]
    ref = tmp_path / "ref"  # the uninterrupted run: in this process (slea_cli), an interpreter saved
    r = slea_cli("train", smoke, "--set", f"run.dir={ref}", *over, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    want = _final_weights(ref)
    assert _trained(want), "the reference run never changed its weights: the comparison would prove nothing"

    run = tmp_path / "run"
    r = subprocess.run(_slea("train", smoke, "--set", f"run.dir={run}", *over), env={**env, "SLEA_TEST_KILL_AT": "1"},
                       cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr[-3000:])
    assert (run / "checkpoints" / ".tmp-iter_000002" / "manifest.json").is_file()  # killed mid-checkpoint
    assert [p.name for p in ckpt.list_checkpoints(run / "checkpoints")] == ["iter_000001"]
    assert [row["iteration"] for row in read_metrics(run / "metrics.jsonl")] == [0, 1]

    r = subprocess.run(_slea("train", "--resume", str(run)), env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed after iteration 1/2 (checkpoints/iter_000001); continuing with iteration 2/2" in r.stdout, \
        r.stdout[-2000:]
    rel.assert_same_metrics(read_metrics(run / "metrics.jsonl"), read_metrics(ref / "metrics.jsonl"))
    got = _final_weights(run)
    # bit-exact: the same CPU kind and thread count on both sides (case 1, module docstring)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    a = json.loads((run / "eval/after.json").read_text())
    b = json.loads((ref / "eval/after.json").read_text())
    assert a["sampled"] == b["sampled"]


@pytest.mark.slow
def test_sigint_to_slea_train_says_how_to_resume_and_the_resumed_run_equals_uninterrupted(tmp_path, rel,
                                                                                         monkeypatch, slea_cli):
    """Ctrl-C (SIGINT) to a real `slea train` on the smoke preset: the iteration in progress is finished and
    checkpointed, the process says where it stopped and prints the resume command, exit code 130; `slea train
    --resume` then gives the uninterrupted run's metrics, weights and held-out evaluation. The interrupted run also
    reports to W&B (offline) and MLflow (a file store), and its resumed process continues the same runs. A
    finished run met by --resume says so and stops; a larger train.iterations extends it."""
    pytest.importorskip("textworld")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), WANDB_MODE="offline", WANDB_SILENT="true",
               MLFLOW_TRACKING_URI=(tmp_path / "mlruns").as_uri(), MLFLOW_ALLOW_FILE_STORE="true")
    smoke = str(ROOT / "configs/smoke.yaml")
    over = [*SMOKE_OVERRIDES, "--set", "train.iterations=4"]
    ref = tmp_path / "ref"  # the uninterrupted run: in this process (slea_cli), an interpreter saved
    r = slea_cli("train", smoke, "--set", f"run.dir={ref}", *over, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]

    run = tmp_path / "run"
    loggers = ["--set", "run.loggers=[jsonl,tensorboard,wandb,mlflow]"]
    p = subprocess.Popen(_slea("train", smoke, "--set", f"run.dir={run}", *over, *loggers), env=env, cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not read_metrics(run / "metrics.jsonl") and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    # the first row is written: iteration 1 is being checkpointed or iteration 2 runs (a fast machine: 3)
    p.send_signal(signal.SIGINT)
    out, errs = p.communicate(timeout=600)
    assert p.returncode == 130, (p.returncode, errs[-3000:])
    done = [row["iteration"] for row in read_metrics(run / "metrics.jsonl")]
    assert 1 <= len(done) < 4 and done == list(range(len(done))), done
    k = len(done)
    assert f"Ctrl-C: stopping after iteration {k}/4, which is then checkpointed" in out, out[-2000:]
    assert errs.strip().splitlines() == [
        f"Ctrl-C: stopped after iteration {k}/4",
        f"last checkpoint: iteration {k}/4 ({run / 'checkpoints' / f'iter_{k:06d}'})",
        f"resume with: slea train --resume {run}"], errs[-3000:]

    r = subprocess.run(_slea("train", "--resume", str(run)), env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed after iteration {k}/4 (checkpoints/iter_{k:06d}); continuing with iteration {k + 1}/4" \
        in r.stdout, r.stdout[-2000:]
    rel.assert_same_metrics(read_metrics(run / "metrics.jsonl"), read_metrics(ref / "metrics.jsonl"))
    got, want = _final_weights(run), _final_weights(ref)
    assert _trained(want) and got.keys() == want.keys() and all(torch.equal(got[n], want[n]) for n in want)
    a = json.loads((run / "eval/after.json").read_text())
    b = json.loads((ref / "eval/after.json").read_text())
    assert a["sampled"] == b["sampled"]

    ids = json.loads((run / "loggers.json").read_text())  # one W&B run and one MLflow run across both processes
    assert len(list((run / "wandb").glob(f"offline-run-*-{ids['wandb']}"))) == 2
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # as the run had it (MLflow 3 asks for this opt-in)
    history = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri()).get_metric_history(ids["mlflow"],
                                                                                          "train/success")
    assert sorted(m.step for m in history) == [0, 1, 2, 3]

    # the two that train nothing in this process (slea_cli): an interpreter each saved
    r = slea_cli("train", "--resume", run, cwd=tmp_path)
    assert r.returncode == 0 and f"{run} is finished: 4 iterations trained and evaluated" in r.stdout, r.stdout
    assert "run folder:" not in r.stdout  # nothing was loaded, nothing re-evaluated
    r = slea_cli("train", "--resume", run, "--set", "train.iterations=4", cwd=tmp_path)
    assert r.returncode == 2 and "already trained 4 iterations" in r.stderr, r.stderr
    r = subprocess.run(_slea("train", "--resume", str(run), "--set", "train.iterations=5"), env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "continuing with iteration 5/5" in r.stdout, r.stdout[-2000:]
    assert [row["iteration"] for row in read_metrics(run / "metrics.jsonl")] == [0, 1, 2, 3, 4]
    assert json.loads((run / "eval/summary.json").read_text())["iterations"] == 5
