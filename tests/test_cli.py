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


def test_library_export_import_merge_diff(tmp_path):
    """The portable-library commands on a real saved run's library, and their one-line errors (exit code 2)."""
    run = ROOT / "bench/results/evidence/default/slea/runs/slea-s0"
    out = tmp_path / "s0.jsonl"
    r = slea("library", "export", str(run), str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "run slea-s0, model embedded, env slea/TextWorld-v0" in " ".join(r.stdout.split())
    header, *rest = [json.loads(x) for x in out.read_text().splitlines()]
    n_entries = sum(x["kind"] == "entry" for x in rest)
    assert header["provenance"]["run"] == "slea-s0" and n_entries > 0
    r = slea("library", "import", str(out), str(tmp_path / "copy.sqlite"))
    assert r.returncode == 0, r.stderr[-2000:]
    again = tmp_path / "again.jsonl"
    assert slea("library", "export", str(tmp_path / "copy.sqlite"), str(again)).returncode == 0
    assert sum(json.loads(x)["kind"] == "entry" for x in again.read_text().splitlines()) == n_entries
    r = slea("library", "diff", str(run), str(tmp_path / "copy.sqlite"))  # a copy: every entry the same
    assert r.returncode == 0, r.stderr[-2000:]
    same = [int(line.split("│")[-2]) for line in r.stdout.splitlines() if line.count("│") == 7
            and line.split("│")[1].strip() in ("pos", "neg")]
    assert sum(same) == n_entries
    r = slea("library", "merge", str(out), str(tmp_path / "copy.sqlite"), "--out", str(tmp_path / "m.sqlite"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert f": {n_entries} entries" in " ".join(r.stdout.split())  # the second source: all duplicates

    one_line_exit_2(slea("library", "export", str(tmp_path / "nothing"), str(out)), "export:", "no such file")
    one_line_exit_2(slea("library", "import", str(tmp_path / "nope.jsonl"), str(tmp_path / "x.sqlite")),
                    "import:", "no such file")
    (tmp_path / "junk.jsonl").write_text('{"a": 1}\n')
    one_line_exit_2(slea("library", "diff", str(tmp_path / "junk.jsonl"), str(run)), "not a slea library export")
    (tmp_path / "junk.sqlite").write_text("not a database")
    one_line_exit_2(slea("library", "import", str(out), str(tmp_path / "junk.sqlite")), "not an experience library")
    one_line_exit_2(slea("library", "merge", str(out), str(run), "--out", str(tmp_path / "m.sqlite")), "exists")
    one_line_exit_2(slea("library", "merge", str(out), "--out", str(tmp_path / "m2.sqlite")), "at least two")


@pytest.mark.slow
def test_agent_with_and_without_a_library_on_the_tiny_model(tmp_path):
    """`slea agent` end to end: the tiny model on Sokoban steered by a JSONL export, evolving."""
    run = ROOT / "bench/results/evidence/default/slea/runs/slea-s0"
    lib = tmp_path / "s0.jsonl"
    assert slea("library", "export", str(run), str(lib)).returncode == 0
    small = ["--games", "2", "--episodes", "1", "--set", "env.max_steps=2", "--set", "rollout.max_new_tokens=4",
             "--set", "eval.greedy=false"]
    r = slea("agent", "--model", "tiny", "--library", str(lib), "--env", "slea/Sokoban-v0", "--evolve",
             "--out", str(tmp_path / "out"), *small)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "out/agent.json").read_text())
    assert res["library_provenance"]["run"] == "slea-s0" and res["evolve"] is True
    assert set(res["difference"]["sampled"]) >= {"success", "return", "retrieval_hit_rate"}
    assert res["without"]["sampled"]["episodes"] == res["with"]["sampled"]["episodes"] == 2
    assert res["library"]["before"]["size"] == 19 and len(res["library"]["rounds"]) == 2
    assert (tmp_path / "out/library.sqlite").is_file()  # the evolved library, kept
    assert "sampled success" in r.stdout and "difference" in r.stdout


def test_agent_bad_arguments_are_one_line_with_exit_code_2(tmp_path):
    """Checked before any model loads."""
    lib = tmp_path / "s0.jsonl"
    assert slea("library", "export", str(ROOT / "bench/results/evidence/default/slea/runs/slea-s0"),
                str(lib)).returncode == 0
    one_line_exit_2(slea("agent", "--model", "tiny", "--library", str(tmp_path / "none.jsonl"), "--env",
                         "slea/Sokoban-v0"), "agent: --library: no such file")
    one_line_exit_2(slea("agent", "--model", str(tmp_path / "no-model"), "--library", str(lib), "--env",
                         "slea/Sokoban-v0"), "agent: --model", "is neither a run folder")
    one_line_exit_2(slea("agent", "--model", "tiny", "--library", str(lib), "--env", "slea/Nope-v0"),
                    "env.id: unknown env")


@pytest.mark.slow
def test_agent_loads_a_run_folder_s_checkpoint_and_extracts_with_its_base_weights(tmp_path):
    """MODEL = a run folder: its config and last checkpoint's LoRA weights (made here, not trained); --library
    the same run; --evolve with the LLM extractor (the trainer's generate_text: LoRA disabled for the call)."""
    import torch

    from slea.config import dump_config, load_config
    from slea.experience.portable import working_copy
    from slea.policy.model import load_policy
    from slea.trainer.checkpoint import save_checkpoint

    run = tmp_path / "run"
    cfg = load_config(ROOT / "configs/smoke.yaml", [f"run.dir={run}"])
    model, _ = load_policy(cfg.model)
    lora = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert lora
    with torch.no_grad():
        for p in lora:
            p.add_(0.01)  # a non-zero adapter: the checkpoint is not the base model
    run.mkdir()
    (run / "config.yaml").write_text(dump_config(cfg))
    working_copy(ROOT / "bench/results/evidence/default/slea/runs/slea-s0", run / "library.sqlite")
    save_checkpoint(run / "checkpoints", 1, model, torch.optim.AdamW([p for p in model.parameters()
                                                                      if p.requires_grad]))
    r = slea("agent", "--model", str(run), "--library", str(run), "--env", "slea/Sokoban-v0", "--evolve",
             "--games", "1", "--episodes", "2", "--set", "env.max_steps=2", "--set", "eval.greedy=false",
             "--set", "experience.extractor=llm", "--set", "experience.extract_max_new_tokens=8",
             "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "out/agent.json").read_text())
    assert res["checkpoint"] == "iter_000001" and res["library_provenance"]["run"] == "smoke"
    rounds = res["library"]["rounds"]
    assert len(rounds) == 1 and rounds[0]["extract_llm_answers"] > 0  # the model was asked for lessons
