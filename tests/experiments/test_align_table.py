"""experiments/align_table.py's plan, stage sharing, reuse and table on fake run folders (configs/align_tiny.yaml's job;
no model is loaded, nothing is trained)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from slea.config import dump_config
from slea.testing.bench import load_script

ROOT = Path(__file__).resolve().parents[2]


A = load_script(ROOT / "experiments" / "align_table.py")
ENV = "tiny"


def _eval(success: float, **values) -> dict:
    return {"sampled": {"success": success}, "table": {"rows": [{"label": "x", "values": values}]}}


def _started(root: Path, method: str, seed: int = 0, cfg=None, **align) -> Path:
    """A run folder as the pipeline leaves it after writing config.yaml."""
    d = A.run_dir(ENV, method, seed, root)
    d.mkdir(parents=True, exist_ok=True)
    cfg = cfg or A.preset(ENV, seed)
    if method in ("sft", *A.PAIR_METHODS):  # slea train (sft_grpo) keeps the preset's align section as it is
        cfg.align.method = method
    for k, v in align.items():
        setattr(cfg.align, k, v)
    cfg.run.dir = str(d)
    (d / "config.yaml").write_text(dump_config(cfg))
    return d


def _sft_done(root: Path, seed: int = 0) -> Path:
    d = _started(root, "sft", seed)
    (d / "expert.jsonl").write_text("{}\n")
    (d / "sft.json").write_text("{}")
    ck = d / "checkpoints" / "iter_000001"
    ck.mkdir(parents=True)
    (ck / "trainable.safetensors").write_bytes(b"w")
    return d


def _finish(d: Path, splits=("heldout",), success: float = 0.5) -> None:
    (d / "eval").mkdir(parents=True, exist_ok=True)
    for s in splits:
        (d / "eval" / f"eval-{s}.json").write_text(json.dumps(_eval(success)))


def _argv(cmd: list[str]) -> list[str]:
    assert cmd[:3] == [sys.executable, "-m", "slea.cli"]
    return cmd[3:]


def test_sft_first_then_resume(tmp_path):
    p = A.plan(ENV, "sft", 0, tmp_path)
    assert p.state == "new" and not p.copies
    argv = _argv(p.commands[0])
    assert argv[:4] == ["align", str(ROOT / "configs/align_tiny.yaml"), "--method", "sft"]
    assert f"run.dir={A.run_dir(ENV, 'sft', 0, tmp_path)}" in argv and "run.seed=0" in argv
    assert "align.expert_episodes=2" in argv  # the job's overrides travel with it
    d = _started(tmp_path, "sft")
    p = A.plan(ENV, "sft", 0, tmp_path)
    assert p.state == "resume" and _argv(p.commands[0]) == ["align", "--resume", str(d)]
    _finish(d)
    (d / "sft.json").write_text("{}")
    (d / A.FROM_SFT[0]).mkdir(parents=True)
    (d / A.FROM_SFT[0] / "trainable.safetensors").write_bytes(b"w")
    p = A.plan(ENV, "sft", 0, tmp_path)
    assert p.state == "finished" and not p.commands


def test_pair_methods_wait_for_the_seeds_sft_run(tmp_path):
    for method in (*A.PAIR_METHODS, "sft_grpo"):
        p = A.plan(ENV, method, 0, tmp_path)
        assert p.state == "blocked" and "--method sft --seed 0" in p.note and not p.commands
    _sft_done(tmp_path, seed=1)  # another seed's SFT does not count
    assert A.plan(ENV, "dpo", 0, tmp_path).state == "blocked"
    with pytest.raises(SystemExit):
        A.run(ENV, "dpo", 0, tmp_path, execute=lambda *a, **k: pytest.fail("ran"))


def test_pair_method_takes_expert_and_sft_from_the_sft_run(tmp_path):
    sft = _sft_done(tmp_path)
    p = A.plan(ENV, "tlm_dre", 0, tmp_path)
    assert p.state == "new"
    assert [(s.relative_to(sft).as_posix(), t.relative_to(p.dir).as_posix()) for s, t in p.copies] == \
        [(f, f) for f in A.FROM_SFT]  # the checkpoint first, sft.json (the stage's marker) last
    assert _argv(p.commands[0])[:4] == ["align", str(ROOT / "configs/align_tiny.yaml"), "--method", "tlm_dre"]
    ran = []
    A.run(ENV, "tlm_dre", 0, tmp_path, execute=lambda cmd, check: ran.append(cmd))
    assert len(ran) == 1
    for f in A.FROM_SFT:
        assert (p.dir / f).exists()
    assert (p.dir / "checkpoints/iter_000001/trainable.safetensors").read_bytes() == b"w"
    assert json.loads((p.dir / "shared.json").read_text())["sft.json"] == "runs/sft-s0/sft.json"
    assert not list(p.dir.rglob("*.part"))


def test_later_pair_methods_share_the_first_ones_samples(tmp_path):
    _sft_done(tmp_path)
    first = _started(tmp_path, "dpo")
    assert A.plan(ENV, "dil", 0, tmp_path).copies[-1][0].name == "sft.json"  # dpo has no samples yet
    (first / "samples.jsonl").write_text("{}\n")
    (first / "pairs.json").write_text("{}")
    p = A.plan(ENV, "dil", 0, tmp_path)
    assert [s for s, _ in p.copies][-2:] == [first / "samples.jsonl", first / "pairs.json"]
    assert "samples and pairs from dpo-s0" in p.note
    # a sibling sampled with other settings is not shared
    other = _started(tmp_path, "turn_dpo", samples_per_task=3)
    (other / "samples.jsonl").write_text("{}\n")
    (other / "pairs.json").write_text("{}")
    (first / "pairs.json").unlink()
    assert all(s.name not in A.FROM_SIBLING for s, _ in A.plan(ENV, "tlm_dre", 0, tmp_path).copies)


def test_started_pair_run_resumes_without_copying(tmp_path):
    _sft_done(tmp_path)
    d = _started(tmp_path, "dil")
    p = A.plan(ENV, "dil", 0, tmp_path)
    assert p.state == "resume" and not p.copies and _argv(p.commands[0]) == ["align", "--resume", str(d)]
    _finish(d)
    assert A.plan(ENV, "dil", 0, tmp_path).state == "finished"


def test_runs_of_another_configuration_are_refused(tmp_path):
    _started(tmp_path, "sft", sft_epochs=5)
    p = A.plan(ENV, "sft", 0, tmp_path)
    assert p.state == "blocked" and "align.sft_epochs" in p.note


def test_sft_grpo_trains_from_the_sft_run_then_evaluates(tmp_path):
    sft = _sft_done(tmp_path)
    p = A.plan(ENV, "sft_grpo", 0, tmp_path)
    train, ev = (_argv(c) for c in p.commands)
    assert train[:2] == ["train", str(ROOT / "configs/align_tiny.yaml")] and f"model.init_from={sft}" in train
    assert ev == ["eval", str(p.dir), "--split", "heldout"]
    cfg = A.preset(ENV, 0)
    cfg.model.init_from = str(sft)
    d = _started(tmp_path, "sft_grpo", cfg=cfg)  # slea train's config.yaml names init_from: not a difference
    assert A.plan(ENV, "sft_grpo", 0, tmp_path).commands[0][3:] == ["train", "--resume", str(d)]
    (d / "eval").mkdir()
    (d / "eval" / "summary.json").write_text("{}")  # training done: only the split evaluations remain
    assert [_argv(c)[0] for c in A.plan(ENV, "sft_grpo", 0, tmp_path).commands] == ["eval"]


def test_prompt_row_is_slea_eval_of_the_preset(tmp_path):
    p = A.plan(ENV, "prompt", 0, tmp_path)
    argv = _argv(p.commands[0])
    assert argv[:6] == ["eval", str(ROOT / "configs/align_tiny.yaml"), "--split", "heldout", "--out", str(p.dir)]


def test_table_mean_std_over_seeds_and_unfinished_runs_left_out(tmp_path):
    for seed, s in ((0, 0.25), (1, 0.75)):
        _finish(A.run_dir(ENV, "sft", seed, tmp_path), success=s)
    _finish(A.run_dir(ENV, "tlm_dre", 0, tmp_path), success=1.0)
    A.run_dir(ENV, "dpo", 0, tmp_path).mkdir(parents=True)  # started, not evaluated
    tab = A.table(ENV, tmp_path, untrained=tmp_path / "none.json")
    assert list(tab["rows"]) == ["sft", "tlm_dre"] and tab["columns"] == ["heldout success %"]
    st = tab["rows"]["sft"]["columns"]["heldout success %"]
    assert st["n"] == 2 and st["mean"] == pytest.approx(50.0) and st["std"] == pytest.approx(35.355, abs=1e-3)
    assert tab["rows"]["sft"]["seeds"] == [0, 1]
    md = (tmp_path / ENV / "table.md").read_text()
    assert "| SFT | 50.0 ± 35.4 | 0, 1 |" in md and "| tlm-DRE | 100.0 | 0 |" in md
    assert json.loads((tmp_path / ENV / "table.json").read_text())["rows"]["tlm_dre"]["columns"]
    with pytest.raises(SystemExit):
        A.table(ENV, tmp_path / "empty", untrained=tmp_path / "none.json")


def test_table_pairs_each_route_with_the_seeds_sft_run(tmp_path):
    def finish(method, seed, wins):  # 4 held-out games, one episode each
        d = A.run_dir(ENV, method, seed, tmp_path)
        (d / "eval").mkdir(parents=True)
        res = {**_eval(sum(wins) / 4), "games": 4, "per_game_wins": wins}
        res["sampled"]["episodes"] = 4.0
        (d / "eval" / "eval-heldout.json").write_text(json.dumps(res))

    for seed in range(3):
        finish("sft", seed, [0, 0, 0, 0])
        finish("dpo", seed, [1, 1, 0, 0])
        finish("tlm_dre", seed, [1, 0, 0, 0] if seed else [1, 1, 0, 0])
    tab = A.table(ENV, tmp_path, untrained=tmp_path / "none.json")
    pairs = {(p["a"], p["b"]): p for p in tab["pairs"]}
    assert set(pairs) == {("dpo", "sft"), ("tlm_dre", "sft"), ("tlm_dre", "dpo")}
    p = pairs[("dpo", "sft")]  # +50 points on every seed: p = 0.25, the smallest 3 seeds allow
    assert p["diffs"] == [50.0] * 3 and p["p"] == 0.25 and p["p_min"] == 0.25 and not p["separated"]
    assert p["ci_method"] == "seeds, then games" and p["games"] == 4
    assert pairs[("tlm_dre", "dpo")]["diffs"] == [0.0, -25.0, -25.0]
    md = (tmp_path / ENV / "table.md").read_text()
    assert "| dpo − sft | 3 | s0 +50.0, s1 +50.0, s2 +50.0 | +50.0 ± 0.0 | 0.250 | 0.250 |" in md


def test_metrics_per_family():
    assert A.metrics("success", _eval(0.5)) == {"success %": 50.0}
    assert A.metrics("score", _eval(0.0, Seen=12.5, boil=3.0)) == {"score": 12.5}
    assert A.metrics("em_f1", _eval(0.0, **{"fanoutqa EM": 10.0, "fanoutqa F1": 20.0})) == {"EM": 10.0, "F1": 20.0}
    assert A.metrics("em_f1", _eval(0.0, **{"a EM": 1.0, "Avg EM": 5.0, "Avg F1": 6.0})) == {"EM": 5.0, "F1": 6.0}


def _untrained(tmp_path, **settings) -> Path:
    fam = {"env": "slea/TextWorld-v0", "games": 8, "sampled": {"success": 0.5, "temperature": 1.0},
           "settings": {"env_kwargs": {"split": "heldout"}, "max_steps": 3,
                        "rollout": {"max_new_tokens": 6, "obs_max_chars": 400}, **settings}}
    f = tmp_path / "untrained.json"
    f.write_text(json.dumps({"families": {"textworld": fam}}))
    return f


def test_untrained_row_only_when_its_settings_are_the_presets(tmp_path):
    cfg = A.preset(ENV, 0)
    row, why = A.untrained_row(ENV, cfg, _untrained(tmp_path))
    assert why == "" and row == {"split": "heldout", "metrics": {"success %": 50.0}, "games": 8}
    row, why = A.untrained_row(ENV, cfg, _untrained(tmp_path, max_steps=8))
    assert row is None and "max_steps 8 vs 3" in why
    _finish(A.run_dir(ENV, "sft", 0, tmp_path))
    A.table(ENV, tmp_path, untrained=_untrained(tmp_path))
    assert "| prompt-only (untrained_eval.json, 8 games) | 50.0 | – |" in (tmp_path / ENV / "table.md").read_text()


def test_presets_load_and_name_their_splits():
    for env, splits in (("alfworld", ["seen", "unseen"]), ("scienceworld", ["seen", "unseen"]),
                        ("searchqa", ["heldout"])):
        cfg = A.preset(env, 2)
        assert cfg.align.eval_splits == splits and cfg.run.seed == 2
        assert cfg.model.name_or_path == "embedded" and cfg.model.lora and cfg.eval.temperature == 0.0
    assert A.preset("alfworld", 0).env.max_steps == 50
    assert A.preset("scienceworld", 0).env.kwargs["admissible"] is False
    assert A.preset("searchqa", 0).rollout.max_new_tokens == 48
    answer = A.preset("searchqa_answer", 0)  # the same preset, on the questions whose evidence holds the answer
    assert answer.env.kwargs["answerable"] == "answer" and answer.eval.games == 18
    assert "answerable" not in A.preset("searchqa", 0).env.kwargs
    # the real untrained_eval.json's rows were made with other settings than the presets: not shown, and why
    for env in ("alfworld", "scienceworld"):
        row, why = A.untrained_row(env, A.preset(env, 0))
        assert row is None and why


def test_copy_interrupted_midway_is_redone_whole(tmp_path):
    sft = _sft_done(tmp_path)
    p = A.plan(ENV, "dpo", 0, tmp_path)
    half = p.dir / "checkpoints" / "iter_000001.part"  # killed while copying the checkpoint
    half.mkdir(parents=True)
    (half / "junk").write_text("x")
    A.seed_run(p)
    assert sorted(f.name for f in (p.dir / "checkpoints" / "iter_000001").iterdir()) == ["trainable.safetensors"]
    assert not half.exists() and (p.dir / "sft.json").read_text() == (sft / "sft.json").read_text()


def test_finished_run_runs_nothing_and_plan_prints_every_method(tmp_path, monkeypatch, capsys):
    _finish(_sft_done(tmp_path))
    assert A.run(ENV, "sft", 0, tmp_path, execute=lambda *a, **k: pytest.fail("ran")).state == "finished"
    monkeypatch.setattr(A, "RESULTS", tmp_path)
    A.main(["plan", "--env", ENV, "--seeds", "0,1"])
    out = capsys.readouterr().out
    assert "sft s0: finished" in out and "tlm_dre s0: new" in out and "dpo s1: blocked" in out
    assert len([x for x in out.splitlines() if " s" in x]) >= 2 * len(A.METHODS)


def test_run_leaves_no_machine_folder_in_the_saved_config(tmp_path):
    """The run folder is committed: its config.yaml names the run repository-relative, and the plan still reads
    it (the same configuration, resumable)."""
    root = tmp_path / "experiments" / "results" / "align"
    A.run(ENV, "sft", 0, root, execute=lambda cmd, check: _started(root, "sft"))
    saved = (A.run_dir(ENV, "sft", 0, root) / "config.yaml").read_text()
    assert str(tmp_path) not in saved and "dir: experiments/results/align/tiny/runs/sft-s0" in saved
    assert A.plan(ENV, "sft", 0, root).state == "resume"


def test_evaluated_sft_run_without_its_weights_trains_the_sft_stage_again(tmp_path):
    """A fresh checkout has the SFT run's evaluations but not its checkpoint (not committed): run --method sft
    removes sft.json, so ``slea align --resume`` redoes that stage, and keeps the evaluations."""
    d = _sft_done(tmp_path)
    _finish(d)
    (d / A.FROM_SFT[0] / "trainable.safetensors").unlink()
    assert A.plan(ENV, "dpo", 0, tmp_path).state == "blocked"
    ran = []
    p = A.run(ENV, "sft", 0, tmp_path, execute=lambda cmd, check: ran.append(_argv(cmd)))
    assert p.state == "resume" and ran == [["align", "--resume", str(d)]]
    assert not (d / "sft.json").exists() and (d / "expert.jsonl").exists() and (d / "eval" / "eval-heldout.json").exists()


def test_scrub_home_writes_tilde_for_the_home_folder_outside_checkpoints(tmp_path):
    home = tmp_path / "home" / "me"
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "expert.jsonl").write_text(json.dumps({"game_file": f"{home}/.cache/slea/g.tw-pddl"}) + "\n")
    (run / "checkpoints" / "state.json").write_text(json.dumps({"p": f"{home}/x"}))
    assert A.scrub_home(run, home) == 1
    assert json.loads((run / "expert.jsonl").read_text())["game_file"] == "~/.cache/slea/g.tw-pddl"
    assert str(home) in (run / "checkpoints" / "state.json").read_text()


def _pair_run(root: Path, method: str, seed: int = 0, samples: str | None = None) -> Path:
    """``run`` of a pair method whose fake pipeline samples (when ``samples``: the method's own samples and pairs,
    when it took none over) and evaluates."""
    def execute(cmd, check):
        d = A.run_dir(ENV, method, seed, root)
        _started(root, method, seed)
        if samples is not None and not (d / "samples.jsonl").exists():
            (d / "samples.jsonl").write_text(samples)
            (d / "pairs.json").write_text('{"pairs": 1}')
        _finish(d)
    return A.run(ENV, method, seed, root, execute=execute).dir


def test_finished_runs_keep_no_copy_and_resumed_runs_get_them_back(tmp_path):
    sft = _sft_done(tmp_path)
    first = _pair_run(tmp_path, "tlm_dre", samples='{"s": 1}\n')  # samples its own failures
    dpo = _pair_run(tmp_path, "dpo")  # takes tlm_dre's samples
    dil = _pair_run(tmp_path, "dil")  # takes the samples again: from where they are, tlm_dre's run
    assert json.loads((dil / "shared.json").read_text())["samples.jsonl"] == "runs/tlm_dre-s0/samples.jsonl"
    for d in (first, dpo, dil):  # finished: what was copied is gone, the checkpoint folder (not committed) stays
        assert not (d / "expert.jsonl").exists() and not (d / "sft.json").exists()
        assert (d / "checkpoints/iter_000001/trainable.safetensors").read_bytes() == b"w"
    assert (first / "samples.jsonl").read_text() == '{"s": 1}\n'  # the source stays
    assert not (dpo / "samples.jsonl").exists() and not (dil / "pairs.json").exists()
    assert A.source(dil, "samples.jsonl") == first / "samples.jsonl"
    assert A.source(dpo, "sft.json") == sft / "sft.json" and A.upstream(first, "samples.jsonl") is None
    # a resumed run: the copies are back before the pipeline runs again
    (dpo / "eval" / "eval-heldout.json").unlink()
    seen = []
    A.run(ENV, "dpo", 0, tmp_path, execute=lambda cmd, check: seen.append(
        {f: (dpo / f).read_text() for f in ("expert.jsonl", "sft.json", "samples.jsonl", "pairs.json")}))
    assert seen == [{"expert.jsonl": "{}\n", "sft.json": "{}", "samples.jsonl": '{"s": 1}\n',
                     "pairs.json": '{"pairs": 1}'}]
    assert (dpo / "samples.jsonl").exists()  # not finished (no evaluation written): the copies stay for the next try


def test_restore_follows_copies_of_copies_and_prune_keeps_changed_copies(tmp_path):
    _sft_done(tmp_path)
    first = _pair_run(tmp_path, "tlm_dre", samples='{"s": 1}\n')
    dpo = _pair_run(tmp_path, "dpo")
    # an older run folder whose shared.json names a sibling's copy (dil from dpo, dpo from tlm_dre)
    dil = _started(tmp_path, "dil")
    (dil / "shared.json").write_text(json.dumps({"samples.jsonl": "runs/dpo-s0/samples.jsonl",
                                                 "pairs.json": "runs/dpo-s0/pairs.json"}))
    assert A.restore_shared(dil) == ["samples.jsonl", "pairs.json"] and A.restore_shared(dil) == []
    assert (dil / "samples.jsonl").read_bytes() == (first / "samples.jsonl").read_bytes()
    (dil / "pairs.json").write_text('{"pairs": 2}')  # the run changed its copy: it is its own file now
    assert A.prune_shared(dil) == ["samples.jsonl"]
    assert (dil / "pairs.json").read_text() == '{"pairs": 2}' and not (dil / "samples.jsonl").exists()
    assert A.restore_shared(dpo) == ["expert.jsonl", "sft.json", "samples.jsonl", "pairs.json"]
    assert A.prune_shared(dpo) == ["expert.jsonl", "sft.json", "samples.jsonl", "pairs.json"]
