"""``slea compare``: sub-runs, table, curves, reuse of finished runs, and the table's arithmetic."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from slea.compare import SubRun, plan, summarize_runs, table_markdown

ROOT = Path(__file__).resolve().parents[1]
SMOKE = str(ROOT / "configs" / "smoke.yaml")
FAST = ["train.iterations=1", "eval.before=false", "eval.greedy=false", "eval.games=1", "eval.episodes_per_game=1",
        "env.max_steps=2"]


@pytest.mark.slow
def test_compare_two_algorithms_then_reuse(tmp_path, slea_cli):
    pytest.importorskip("textworld")
    out = tmp_path / "cmp"
    args = ["compare", SMOKE, "--algorithms", "grpo,rloo", "--seeds", "0", "--out", str(out)]
    for s in FAST:
        args += ["--set", s]
    # the three invocations run in this process (slea_cli: `slea compare` trains its sub-runs in its own process
    # too); tests/test_howto.py runs `slea compare` as a real command
    r = slea_cli(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    for name in ("table.md", "table.json", "curves.png", "compare.json", "runs/grpo-s0/eval/summary.json",
                 "runs/rloo-s0/eval/summary.json"):
        assert (out / name).is_file(), name
    table = json.loads((out / "table.json").read_text())
    assert set(table["algorithms"]) == {"grpo", "rloo"}
    for a in table["algorithms"].values():
        assert a["heldout_success"]["n"] == 1 and a["env_steps"]["mean"] > 0
        assert a["status"] == {"0": "trained"}
    # identical env seeds: both algorithms played the same tasks in iteration 0
    seeds = [json.loads((out / f"runs/{a}-s0/checkpoints").joinpath(p, "state.json").read_text())["next_env_seeds"]
             for a in ("grpo", "rloo") for p in os.listdir(out / f"runs/{a}-s0/checkpoints")]
    assert seeds[0] == seeds[1]
    md = (out / "table.md").read_text()
    assert "| grpo |" in md and "| rloo |" in md
    # rloo against the first arm, paired by seed: the exact sign-flip p, the smallest p one seed allows, the CI
    assert [(p["a"], p["b"], p["n"], p["p_min"]) for p in table["pairs"]] == [("rloo", "grpo", 1, 1.0)]
    assert table["pairs"][0]["p"] == 1.0 and table["pairs"][0]["verdict"] == "not separated"
    assert table["pairs"][0]["ci_method"] == "seeds, then games"  # per-game wins are in each eval/summary.json
    assert "p (exact sign-flip)" in md and "95% CI (bootstrap)" in md  # table.md: every column
    assert "| rloo − grpo | 1 |" in md and "not separated" in md
    assert "  rloo − grpo: " in r.stdout and "  n=1  p=1.000  95% CI [" in r.stdout  # the terminal: within 80
    table_lines = r.stdout[r.stdout.index("algorithm  "):r.stdout.index("\nwrote ")].splitlines()
    assert max(map(len, table_lines)) <= 80
    # second invocation: everything reused (nothing trained: the sub-runs' files are untouched)
    stamps = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*") if p.is_file()}
    r = slea_cli(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*") if p.is_file()} == stamps
    assert r.stdout.count("finished, reused") == 2
    table = json.loads((out / "table.json").read_text())
    assert all(a["status"] == {"0": "reused"} for a in table["algorithms"].values())
    # a different setting for the same folder is refused (exit 2), not silently mixed
    r = slea_cli(*args, "--set", "rollout.group_size=3")
    assert r.returncode == 2 and "another config" in r.stderr


def _fake_run(root: Path, algo: str, seed: int, succ: list[float], steps: list[float], heldout: float,
              wins: list[int] | None = None) -> SubRun:
    """A finished sub-run; ``wins``: its held-out per-game wins, 2 sampled episodes per game."""
    d = root / "runs" / f"{algo}-s{seed}"
    (d / "eval").mkdir(parents=True)
    rows = [{"iteration": i, "train/success": s, "train/return": s, "env_steps": e, "rollouts": 4 * (i + 1)}
            for i, (s, e) in enumerate(zip(succ, steps))]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    after: dict = {"sampled": {"success": heldout}}
    if wins is not None:
        after = {"games": len(wins), "sampled": {"success": heldout, "episodes": 2.0 * len(wins)},
                 "per_game_wins": wins}
    (d / "eval/summary.json").write_text(json.dumps({"after": after, "wall_s": 60}))
    return SubRun(algo, seed, d, "reused")


def test_table_statistics_and_interpolation(tmp_path):
    curves = {("a", 0): ([0.0, 0.5, 1.0], [10, 20, 40]), ("a", 1): ([0.0, 1.0], [20, 60]),
              ("b", 0): ([0.2, 0.2, 0.2], [10, 20, 40])}
    heldout = {("a", 0): 0.4, ("a", 1): 0.6, ("b", 0): 0.1}
    runs = [_fake_run(tmp_path, al, sd, succ, steps, heldout[(al, sd)])
            for (al, sd), (succ, steps) in curves.items()]
    t = summarize_runs(runs)
    # budgets: 25/50/75/100 % of the shortest run's env steps (its last env_steps row), here exact integers
    shortest = min(steps[-1] for _, steps in curves.values())
    assert shortest == 40 and t["budgets"] == [shortest // 4, shortest // 2, 3 * shortest // 4, shortest]
    a = t["algorithms"]["a"]
    assert a["heldout_success"]["mean"] == pytest.approx(0.5)
    assert a["heldout_success"]["std"] == pytest.approx(np.std([0.4, 0.6], ddof=1))
    # seed 0: (10, 0) (20, .5) (40, 1); seed 1: (20, 0) (60, 1), its first value (0) below 20 steps
    at = a["train_success_at_env_steps"]
    assert list(at) == [str(b) for b in t["budgets"]]
    assert at["10"]["values"] == pytest.approx([0.0, 0.0])
    assert at["20"]["values"] == pytest.approx([0.5, 0.0])
    assert at["30"]["values"] == pytest.approx([0.75, 0.25])  # halfway between the logged points around 30
    assert at["40"]["values"] == pytest.approx([1.0, 0.5])
    b_at = t["algorithms"]["b"]["train_success_at_env_steps"]
    assert list(b_at) == list(at) and all(v["values"] == pytest.approx([0.2]) for v in b_at.values())
    assert t["algorithms"]["b"]["heldout_success"]["std"] == 0.0
    assert a["env_steps"]["values"] == [40.0, 60.0] and a["iterations"]["values"] == [3.0, 2.0]
    assert a["rollouts"]["values"] == [12.0, 8.0]  # the last row's cumulative count: 4 per iteration
    md = table_markdown(t)
    assert "0.500 ± 0.141" in md and "| b | 1 | 0.100 |" in md
    assert " | ".join(f"train succ. @ {b} steps" for b in (10, 20, 30, 40)) in md
    # a shortest run of 30 steps: budgets are whole env steps within half a step of 7.5, 15, 22.5 and 30
    odd = summarize_runs([_fake_run(tmp_path / "odd", "c", 0, [0.0, 1.0], [10, 30], 0.0)])["budgets"]
    assert len(odd) == 4 and all(isinstance(b, int) and abs(b - f * 30) <= 0.5
                                 for b, f in zip(odd, (0.25, 0.5, 0.75, 1.0)))
    # a run that played no env step (a team whose actor never produced a command) has no value at any budget
    none = summarize_runs([*runs, _fake_run(tmp_path / "none", "d", 0, [0.0, 0.0], [0, 0], 0.0)])
    assert none["budgets"] == t["budgets"]  # the shortest run with env steps sets them
    assert all(v["mean"] is None for v in none["algorithms"]["d"]["train_success_at_env_steps"].values())
    assert "| d | 1 | 0.000 | – | – | – | – | – | – | 0 |" in table_markdown(none)


def test_pairs_against_the_baseline_with_p_and_ci(tmp_path):
    # b beats a on every one of 3 seeds, by the same 2 of 8 episodes on held-out game 0: p = 0.25, the smallest 3
    # seeds allow, so not separated; a seed's mean is 0.25 on every seed, but the games (+1, 0, 0, 0) widen the CI
    wins_a, wins_b = [0, 1, 1, 2], [2, 1, 1, 2]
    runs = [_fake_run(tmp_path, arm, s, [0.0], [10], sum(w) / 8, w)
            for arm, w in (("a", wins_a), ("b", wins_b)) for s in range(3)]
    runs.append(_fake_run(tmp_path, "c", 0, [0.0], [10], 0.625))  # no per-game wins, one seed
    t = summarize_runs(runs)
    assert t["baseline"] == "a" and [(p["a"], p["b"]) for p in t["pairs"]] == [("b", "a"), ("c", "a")]
    b, c = t["pairs"]
    assert b["diffs"] == pytest.approx([0.25] * 3) and b["mean"] == pytest.approx(0.25) and b["std"] == 0.0
    assert b["p"] == pytest.approx(0.25) and b["p_min"] == 0.25 and not b["separated"]
    assert b["ci_method"] == "seeds, then games" and b["games"] == 4 and b["ci"][0] < 0.25 < b["ci"][1]
    assert c["seeds"] == [0] and c["p"] == 1.0 and c["ci_method"] == "seeds" and c["ci"] == pytest.approx([0.125] * 2)
    md = table_markdown(t)
    assert "Held-out success against a, paired by seed:" in md
    assert "| b − a | 3 | s0 +0.250, s1 +0.250, s2 +0.250 | +0.250 ± 0.000 | 0.250 | 0.250 |" in md
    # another baseline; one without a run is refused
    t = summarize_runs(runs, baseline="b")
    assert [(p["a"], p["b"]) for p in t["pairs"]] == [("a", "b"), ("c", "b")]
    assert t["pairs"][0]["mean"] == pytest.approx(-0.25)
    with pytest.raises(ValueError, match="baseline z"):
        summarize_runs(runs, baseline="z")


def test_finished_runs_from_folder_names_and_rewrite_table(tmp_path):
    from slea.compare import finished_runs, rewrite_table

    for arm, seed in (("slea_task", 1), ("grpo", 0), ("slea", 0), ("slea", 1), ("grpo", 1), ("slea-x", 0)):
        _fake_run(tmp_path, arm, seed, [0.0], [10], 0.1 * seed, [seed, 0])
    (tmp_path / "runs" / "unfinished-s0").mkdir()
    (tmp_path / "runs" / "notes").mkdir()
    runs = finished_runs(tmp_path, order=["slea", "grpo"])
    assert [(r.algorithm, r.seed) for r in runs] == [("slea", 0), ("slea", 1), ("grpo", 0), ("grpo", 1),
                                                    ("slea-x", 0), ("slea_task", 1)]
    (tmp_path / "compare.json").write_text(json.dumps({"algorithms": ["slea", "grpo"], "baseline": "grpo"}))
    t = rewrite_table(tmp_path)
    assert t["baseline"] == "grpo" and (tmp_path / "table.md").is_file()
    assert json.loads((tmp_path / "table.json").read_text())["pairs"][0]["a"] == "slea"
    with pytest.raises(ValueError, match="no finished sub-run"):
        rewrite_table(tmp_path / "empty")


def test_table_only_writes_the_table_again_and_prints_p_and_ci(tmp_path, slea_cli):
    for arm in ("a", "b"):
        for seed in range(3):
            _fake_run(tmp_path, arm, seed, [0.0], [10], 0.5 if arm == "a" else 0.25, [1, 1] if arm == "a" else [1, 0])
    r = slea_cli("compare", "--table-only", "--out", str(tmp_path), "--baseline", "b")
    assert r.returncode == 0, r.stderr
    assert "  a − b: +0.250 ± 0.000  n=3  p=0.250  95% CI [" in r.stdout and "not separated" in r.stdout
    assert max(map(len, r.stdout.splitlines())) <= 80 or "wrote" in max(r.stdout.splitlines(), key=len)
    md = (tmp_path / "table.md").read_text()  # every column, and the per-seed differences, in table.md
    assert "| a − b | 3 | s0 +0.250, s1 +0.250, s2 +0.250 | +0.250 ± 0.000 | 0.250 | 0.250 |" in md
    assert "95% CI (bootstrap)" in md and not (tmp_path / "curves.png").exists()
    r = slea_cli("compare", "--table-only", "--out", str(tmp_path), "--baseline", "z")
    assert r.returncode == 2 and "baseline z" in r.stderr
    r = slea_cli("compare", "--table-only")
    assert r.returncode == 2 and "--out" in r.stderr


def test_plan_validates_every_sub_config_first(tmp_path):
    from slea.config import ConfigError

    p = plan(SMOKE, ["grpo", "slea", "turn_ppo"], [0, 1], tmp_path, overrides=["train.iterations=3"])
    cfgs = {(s.algorithm, s.seed): c for s, c in p.items}
    assert len(cfgs) == 6 and cfgs[("slea", 1)].experience.mode == "step"  # the algorithm's preset
    assert cfgs[("grpo", 1)].run.seed == 1 and cfgs[("turn_ppo", 0)].train.iterations == 3
    assert str(cfgs[("grpo", 0)].run.dir).endswith("runs/grpo-s0")
    with pytest.raises(ConfigError, match="algorithm.name"):
        plan(SMOKE, ["grpo", "nope"], [0], tmp_path)
    assert plan(SMOKE, ["grpo", "slea"], [0], tmp_path, baseline="slea").spec["baseline"] == "slea"
    with pytest.raises(ValueError, match="--baseline rloo: not one of the compared arms"):
        plan(SMOKE, ["grpo", "slea"], [0], tmp_path, baseline="rloo")
    assert not (tmp_path / "runs").exists()


def test_rtpo_preset_plans_against_grpo_and_gigpo_at_one_budget(tmp_path):
    from slea.config import ConfigError

    p = plan(str(ROOT / "configs" / "rtpo.yaml"), ["rtpo", "grpo", "gigpo"], [0, 1], tmp_path)
    cfgs = {(s.algorithm, s.seed): c for s, c in p.items}
    rtpo, grpo = cfgs[("rtpo", 0)], cfgs[("grpo", 0)]
    assert (rtpo.algorithm.gamma, rtpo.algorithm.loss_agg) == (1.0, "seq-mean-token-mean")  # rtpo's defaults only
    assert (grpo.algorithm.gamma, grpo.algorithm.loss_agg) == (0.95, "token-mean")
    preset = yaml.safe_load(Path("configs/rtpo.yaml").read_text())["train"]["env_step_budget"]
    assert {c.train.env_step_budget for c in cfgs.values()} == {preset}  # one budget for all: matched
    assert p.spec["algorithm_defaults"]["rtpo"]["algorithm.skip_zero_advantage"] is False
    # rollout.trunks is read by rtpo: accepted in the comparison, refused for grpo alone
    with pytest.raises(ConfigError, match="rollout.trunks"):
        plan(str(ROOT / "configs" / "rtpo.yaml"), ["grpo"], [0], tmp_path, overrides=["rollout.trunks=2"])


def _fake_trainer(record):
    """A trainer class for a sub-run that trains nothing: ``record(run_dir, resume)`` when it is fit, then a finished
    run's files (one metrics row, a summary)."""

    class FakeTrainer:
        def __init__(self, cfg, run_dir=None):
            self.cfg, self.dir = cfg, Path(run_dir)

        def fit(self, resume=False):
            record(self.dir, resume)
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / "metrics.jsonl").write_text(json.dumps({"iteration": 0, "train/success": 0.5,
                                                                "env_steps": 12}) + "\n")
            (self.dir / "eval").mkdir(exist_ok=True)
            (self.dir / "eval/summary.json").write_text(json.dumps({"after": {"sampled": {"success": 0.25}}}))

        def close(self):
            pass

    return FakeTrainer


def test_unfinished_sub_run_resumes_finished_is_reused(tmp_path, monkeypatch):
    import torch

    from slea.compare import run
    from slea.runs import checkpoint as ckpt
    from slea.trainer import rl

    calls = []
    monkeypatch.setattr(rl, "Trainer", _fake_trainer(lambda d, resume: calls.append((d.name, resume))))
    p = plan(SMOKE, ["grpo", "rloo"], [0], tmp_path)
    net = torch.nn.Linear(2, 1)  # rloo-s0 was interrupted after its first checkpoint
    ckpt.save_checkpoint(tmp_path / "runs/rloo-s0/checkpoints", 0, net, torch.optim.AdamW(net.parameters()))
    table = run(p)
    assert calls == [("grpo-s0", False), ("rloo-s0", True)]
    assert table["algorithms"]["rloo"]["status"] == {"0": "resumed"}
    assert table["algorithms"]["grpo"]["heldout_success"]["mean"] == 0.25
    calls.clear()
    table = run(plan(SMOKE, ["grpo", "rloo"], [0], tmp_path))
    assert calls == [] and table["algorithms"]["grpo"]["status"] == {"0": "reused"}
    assert (tmp_path / "curves.png").is_file() and (tmp_path / "table.md").is_file()


def test_relativize_strips_machine_folders_from_saved_files_only(tmp_path):
    from slea.compare import relativize

    run = tmp_path / "runs" / "grpo-s0"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("config: /home/me/repo/configs/slea.yaml\nout: /x/y/bench/results/ev/a\n")
    (run / "eval.json").write_text('{"dir": "/x/y/experiments/results/align/x"}')
    (run / "checkpoints" / "meta.json").write_text('{"dir": "/x/bench/results/ev"}')
    (run / "metrics.jsonl").write_text('{"dir": "/x/bench/results/ev"}')
    assert relativize(tmp_path) == 2
    assert (run / "config.yaml").read_text() == "config: configs/slea.yaml\nout: bench/results/ev/a\n"
    assert (run / "eval.json").read_text() == '{"dir": "experiments/results/align/x"}'
    assert "/x/" in (run / "checkpoints" / "meta.json").read_text() and "/x/" in (run / "metrics.jsonl").read_text()
    assert relativize(tmp_path) == 0  # nothing left to rewrite


def test_config_diff_compares_top_level_lists_such_as_plugins_whole(tmp_path):
    from slea.compare import config_diff, same_config
    from slea.config import build_config, dump_config

    cfg = build_config({})
    saved = yaml.safe_load(dump_config(cfg))
    (tmp_path / "same.yaml").write_text(yaml.safe_dump(saved))
    assert config_diff(tmp_path / "same.yaml", cfg) == [] and same_config(tmp_path / "same.yaml", cfg) == (True, "")
    saved["plugins"] = ["someone_elses_plugin"]
    saved["train"]["lr"] = 0.5
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(saved))
    assert config_diff(tmp_path / "other.yaml", cfg) == ["plugins", "train.lr"]
    assert same_config(tmp_path / "other.yaml", cfg) == (False, "plugins: ['someone_elses_plugin'] there, [] now")


def test_each_comparison_has_its_own_folder(tmp_path, monkeypatch):
    """No --out: runs/compare-<config>-<hash>; the same comparison finds its folder again, and a comparison that
    differs in its algorithms, their order, its variants, seeds, overrides, baseline or the config file's text
    gets another one (before, all went to runs/compare-<config>, the second overwriting the first's table)."""
    from slea.compare import default_out, make_arms

    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "smoke.yaml"
    cfg.write_text(Path(SMOKE).read_text())

    def out(algos=("grpo", "rloo"), seeds=(0,), over=(), variants=None, baseline=None):
        return plan(cfg, list(algos), list(seeds), None, overrides=list(over), variants=variants,
                    baseline=baseline).out

    first = out()
    assert first.parent == Path("runs") and first.name.startswith("compare-smoke-") and len(first.name) == 22
    assert out() == first == default_out(cfg, make_arms(["grpo", "rloo"], None, []), [0], [])
    others = [out(("grpo", "gigpo")), out(("rloo", "grpo")), out(seeds=(0, 1)), out(over=["train.iterations=3"]),
              out(baseline="rloo"), out((), variants={"a": ["train.lr=1e-4"], "b": ["train.lr=1e-3"]}),
              out((), variants={"a": ["train.lr=1e-4"], "b": ["train.lr=3e-3"]})]
    assert len({first, *others}) == len(others) + 1
    cfg.write_text(Path(SMOKE).read_text() + "\n# edited\n")
    assert out() != first
    assert plan(cfg, ["grpo"], [0], tmp_path / "mine").out == tmp_path / "mine"  # --out is used as given


def test_a_sub_run_stopped_before_its_first_checkpoint_starts_over_in_a_cleared_folder(tmp_path, monkeypatch):
    """Its metrics rows, events and evaluations would otherwise mix with the new run's."""
    from slea.compare import run
    from slea.trainer import rl

    seen = []
    monkeypatch.setattr(rl, "Trainer", _fake_trainer(
        lambda d, resume: seen.append((resume, sorted(p.name for p in d.iterdir()) if d.exists() else None))))
    p = plan(SMOKE, ["grpo"], [0], tmp_path)
    stale = tmp_path / "runs" / "grpo-s0"
    (stale / "events").mkdir(parents=True)
    (stale / "metrics.jsonl").write_text('{"iteration": 0}\n{"iteration": 1}\n')
    said = []
    run(p, say=said.append)
    assert seen == [(False, None)]  # trained in an empty folder
    assert [json.loads(x)["iteration"] for x in (stale / "metrics.jsonl").read_text().splitlines()] == [0]
    assert not (stale / "events").exists() and any("starting it over" in s for s in said)


def test_the_terminal_table_fits_80_columns_and_table_md_keeps_every_column(tmp_path):
    """Before, the terminal printed table.md: 6 algorithms at 4 budgets ran 540 characters wide."""
    from slea.compare import terminal_table

    arms = ["grpo", "rloo", "gigpo", "ppo", "turn_ppo", "slea-with-a-rather-long-variant-label-that-goes-on"]
    runs = [_fake_run(tmp_path, a, s, [0.1, 0.2, 0.3, 0.4], [100, 200, 300, 400], 0.25 + 0.125 * (i % 3),
                      [i % 2, 1, s % 2, 1]) for i, a in enumerate(arms) for s in range(3)]
    t = summarize_runs(runs)
    t["spec"] = {"config": "configs/smoke.yaml", "seeds": [0, 1, 2], "overrides": ["rollout.groups=4"] * 6}
    md = table_markdown(t)
    assert max(map(len, md.splitlines())) > 200  # what the terminal used to get
    text = terminal_table(t)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 80, max(lines, key=len)
    head, *rows = lines[:1 + len(arms)]
    assert head.split() == ["algorithm", "seeds", "held-out", "success", "env", "steps", "wall", "(min)"]
    assert [r.split()[0] for r in rows[:5]] == arms[:5] and rows[5].split()[0].endswith("…")
    # seeds, held-out success, env steps, wall minutes (each mean ± std over the seeds)
    assert rows[0].split()[1:] == ["3", "0.250", "±", "0.000", "400", "±", "0", "1.0", "±", "0.0"]
    assert "against grpo, held-out success paired by seed:" in text
    pair = next(x for x in lines if x.startswith("  rloo − grpo: "))
    c = t["pairs"][0]
    assert pair.startswith(f"  rloo − grpo: +0.125 ± 0.000  n=3  p={c['p']:.3f}  95% CI [")
    assert "not separated" in text and text.count(" − grpo: ") == len(arms) - 1
    narrow = terminal_table(t, width=50)  # the pair lines wrap, and every line fits
    assert max(map(len, narrow.splitlines())) <= 50 and "    not separated" in narrow
