"""The CLI end to end on the smoke preset, and config errors."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def slea(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run([sys.executable, "-m", "slea.cli", *args], check=False, capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=600)


def test_config_error_exit_code_2_names_the_key(tmp_path):
    r = slea("train", str(ROOT / "configs/smoke.yaml"), "--set", "rollout.grups=3")
    assert r.returncode == 2
    assert "rollout.grups" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = slea("train", "--set", "train.lr=-1")
    assert r.returncode == 2 and "train.lr" in r.stderr
    # a value only the model can check (the tiny model has 2 layers): still one line and exit code 2
    r = slea("train", str(ROOT / "configs/smoke.yaml"), "--set", "model.lora_layers=5", "--set",
             f"run.dir={tmp_path / 'run'}")
    assert r.returncode == 2, r.stderr[-2000:]
    assert "model.lora_layers" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def one_line_exit_2(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    for n in needles:
        assert n in r.stderr, (n, r.stderr)


def test_cli_errors_are_one_line_with_exit_code_2(tmp_path):
    smoke = str(ROOT / "configs/smoke.yaml")
    # checked before the model loads: with a model that does not exist, the env / needs error still comes first
    nomodel = ["--set", f"model.name_or_path={tmp_path / 'no-model'}", "--set", f"run.dir={tmp_path / 'run'}"]
    one_line_exit_2(slea("train", smoke, "--set", "env.id=slea/Nope-v0", *nomodel),
                    "env.id: unknown env 'slea/Nope-v0'")
    one_line_exit_2(slea("train", smoke, "--set", "plugins=[my_slea_plugin]", "--set",
                         "algorithm.name=test_plugin_team", *nomodel, cwd=ROOT / "tests/plugins"),
                    "algorithm.name: test_plugin_team needs a team of agents", "does not provide")
    one_line_exit_2(slea("train", smoke, "--set", "algorithm.clip_eps_high=0.28"),
                    "algorithm.clip_eps_high: not read by policy_loss ppo_clip")
    one_line_exit_2(slea("train", "--resume", str(tmp_path)), "--resume:", "no config.yaml")
    one_line_exit_2(slea("eval", str(tmp_path / "nothing-here")), "is neither a run folder")
    one_line_exit_2(slea("eval", "some-org/not-a-cached-model"), "is neither a run folder")
    one_line_exit_2(slea("library", "show", str(tmp_path)), "no experience library at")
    (tmp_path / "junk.sqlite").write_text("not a database")
    one_line_exit_2(slea("library", "search", str(tmp_path / "junk.sqlite"), "kitchen"), "not an experience library")
    one_line_exit_2(slea("compare", smoke, "--seeds", "a,b"), "--seeds")


def test_nproc_errors_are_one_line_before_any_process_starts(tmp_path):
    smoke = str(ROOT / "configs/smoke.yaml")
    run = ["--set", f"run.dir={tmp_path / 'run'}"]
    one_line_exit_2(slea("train", smoke, "--nproc", "3", "--set", "rollout.groups=2", *run),
                    "rollout.groups: 2 task groups cannot be shared by 3 processes")
    one_line_exit_2(slea("train", smoke, "--nproc", "2", "--set", "algorithm.dynamic_sampling=true", *run),
                    "algorithm.dynamic_sampling: not supported with more than one process")
    assert not (tmp_path / "run").exists()


def test_envs_lists_every_id_whole_in_80_columns():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), COLUMNS="80")
    r = subprocess.run([sys.executable, "-m", "slea.cli", "envs"], check=False, capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    ids = subprocess.run([sys.executable, "-c", "import slea.envs; print(*slea.envs.registered(), sep=chr(10))"],
                         check=True, capture_output=True, text=True, env=env, timeout=600).stdout.split()
    assert len(ids) >= 10  # every family's ids, as that process registers them
    for env_id in ids:
        assert env_id in r.stdout, env_id


@pytest.mark.slow
def test_smoke_preset_writes_the_run_folder(tmp_path):
    pytest.importorskip("textworld")
    run = tmp_path / "run"
    r = slea("train", str(ROOT / "configs/smoke.yaml"), "--set", f"run.dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    for name in ("config.yaml", "metrics.jsonl", "curves.png", "eval/before.json", "eval/after.json",
                 "eval/summary.json"):
        assert (run / name).is_file(), name
    assert list((run / "events").iterdir()), "TensorBoard events"
    ck = sorted((run / "checkpoints").iterdir())
    assert ck and (ck[-1] / "trainable.safetensors").is_file() and (ck[-1] / "optimizer.safetensors").is_file()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1]
    for key in ("train/success", "train/return", "train/invalid_rate", "tokens/generated", "time/generation_s",
                "time/env_s", "time/train_s"):
        assert key in rows[0], key
    after = json.loads((run / "eval/after.json").read_text())
    assert 0.0 <= after["sampled"]["success"] <= 1.0
    # stdout is a pipe here, not a terminal: plain progress lines (phase, episodes done, elapsed)
    out = r.stdout
    assert re.search(r"iteration 1 rollout: \d+/3, 4/4 episodes done \[\d+s\]", out), out[-3000:]
    assert re.search(r"held-out eval \(sampled\): \d+/3, 4/4 episodes done \[\d+s\]", out), out[-3000:]
    assert "held-out (trained): sampled success" in out
    # the run's evaluation re-run from its folder gives the same numbers
    r = slea("eval", str(run))
    assert r.returncode == 0, r.stderr[-2000:]
    again = json.loads((run / "eval/eval-heldout.json").read_text())
    for key in ("sampled", "greedy", "per_game_wins"):
        assert again[key] == after[key], key


@pytest.mark.slow
def test_slea_run_builds_a_library_the_cli_can_inspect(tmp_path):
    pytest.importorskip("textworld")
    run = tmp_path / "slea"
    r = slea("train", str(ROOT / "configs/smoke.yaml"), "--set", f"run.dir={run}", "--set", "algorithm.name=slea",
             "--set", "experience.mode=step", "--set", "experience.warmup_iters=0", "--set",
             "experience.min_entries=0", "--set", "eval.before=false")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (run / "library.sqlite").is_file()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(k.startswith("library/") for k in rows[0]), rows[0].keys()
    show = slea("library", "show", str(run))
    assert show.returncode == 0 and ("pos" in show.stdout or "neg" in show.stdout)
    search = slea("library", "search", str(run), "You are in a room. There is a coin.")
    assert search.returncode == 0 and "cluster" in search.stdout
    out = tmp_path / "lib.jsonl"
    assert slea("library", "export", str(run), str(out)).returncode == 0
    assert out.read_text().strip(), "exported entries"
