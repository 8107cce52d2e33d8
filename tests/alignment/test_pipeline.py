"""`slea align`'s pipeline end to end on the tiny model and TextWorld: stages, resume, model.init_from."""

import json

import pytest

pytest.importorskip("textworld")  # the optional third-party engine the pipeline plays

import slea.alignment.objectives  # noqa: F401  (in-tree training steps: a broken module fails, never skips)
from slea.alignment.data import load_jsonl
from slea.alignment.pipeline import AlignPipeline
from slea.config import ConfigError, build_config

TINY = {
    "model": {"name_or_path": "tiny", "dtype": "float32", "lora": True, "lora_r": 4, "lora_alpha": 8,
              "lora_targets": ["q_proj", "v_proj"]},
    "env": {"id": "slea/TextWorld-v0", "kwargs": {"tasks": ["coin_collector:1"], "num_games": 2},
            "eval_kwargs": {"num_games": 1}, "max_steps": 2},
    "rollout": {"groups": 2, "group_size": 1, "max_new_tokens": 4},
    "train": {"micro_batch": 8},
    "eval": {"games": 1, "episodes_per_game": 1, "greedy": False},
    "align": {"method": "tlm_dre", "expert_episodes": 2, "sft_epochs": 1, "samples_per_task": 1, "batch_size": 2,
              "eval_splits": ["heldout"]},
}


def _cfg(run_dir, *overrides):
    return build_config({**TINY, "run": {"dir": str(run_dir)}}, list(overrides))


@pytest.fixture(scope="module")
def aligned_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("align") / "run"
    said: list[str] = []
    results = AlignPipeline(_cfg(run), run, say=said.append).run()
    return run, said, results


def test_every_stage_writes_its_output(aligned_run):
    run, said, results = aligned_run
    for name in ("config.yaml", "expert.jsonl", "sft.json", "samples.jsonl", "pairs.json", "align.json",
                 "pivot.png", "eval/eval-heldout.json", "checkpoints/iter_000001", "checkpoints/iter_000002"):
        assert (run / name).exists(), name
    expert, samples = load_jsonl(run / "expert.jsonl"), load_jsonl(run / "samples.jsonl")
    assert len(expert) == 2 and all(t.success and t.source == "walkthrough" for t in expert)
    assert len(samples) == 2 and all(t.source == "sampled" for t in samples)
    assert all(turn.response_ids for t in samples for turn in t.turns)  # the sampled ids are kept
    pairs = json.loads((run / "pairs.json").read_text())
    failed = [i for i, t in enumerate(samples) if not t.success]
    assert sorted(r for _, r in pairs["pairs"]) == failed  # every failure is paired with its task's expert
    for c, r in pairs["pairs"]:
        assert expert[c].task == samples[r].task
    align = json.loads((run / "align.json").read_text())
    assert align["method"] == "tlm_dre" and align["pairs"] == len(failed)
    assert set(align["settings"]) >= {"pivot", "omega_low", "omega_high", "kernel"} and "beta" not in align["settings"]
    assert len(align["steps"]) == -(-len(failed) // 2) and all(s["skipped"] == 0 for s in align["steps"])
    assert results["heldout"]["checkpoint"] == "iter_000002"
    assert not any("skipped" in line for line in said)


def test_resume_skips_finished_stages_and_redoes_the_interrupted_one(aligned_run):
    run, _, _ = aligned_run
    sft_weights = (run / "checkpoints/iter_000001/trainable.safetensors").read_bytes()
    first = json.loads((run / "align.json").read_text())
    (run / "align.json").unlink()  # interrupted during the align stage (its output was not written)
    (run / "eval/eval-heldout.json").unlink()
    said: list[str] = []
    AlignPipeline(_cfg(run), run, say=said.append).run()
    for stage in ("expert", "sft", "sample", "pairs"):
        assert any(line.startswith(f"stage {stage}: done") for line in said), (stage, said)
    assert "stage align: running" in said and "stage eval heldout: running" in said
    assert (run / "checkpoints/iter_000001/trainable.safetensors").read_bytes() == sft_weights
    again = json.loads((run / "align.json").read_text())
    assert [s["loss"] for s in again["steps"]] == pytest.approx([s["loss"] for s in first["steps"]])


def test_init_from_starts_from_a_runs_weights(aligned_run, tmp_path):
    import torch
    from safetensors.torch import load_file

    from slea.policy.model import load_policy

    run, _, _ = aligned_run
    cfg = _cfg(tmp_path / "rl", f"model.init_from={run}")
    model, _ = load_policy(cfg.model)
    saved = load_file(str(run / "checkpoints/iter_000002/trainable.safetensors"))
    params = dict(model.named_parameters())
    assert saved and all(torch.equal(params[k], v) for k, v in saved.items())
    with pytest.raises(ConfigError, match="model.init_from: .* model.lora_r=4, this config has 8"):
        load_policy(_cfg(tmp_path / "x", f"model.init_from={run}", "model.lora_r=8").model)
    with pytest.raises(ConfigError, match="not a run folder"):
        load_policy(_cfg(tmp_path / "y", f"model.init_from={tmp_path}").model)


def test_unknown_method_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match="align.method: unknown method 'ppo'"):
        AlignPipeline(_cfg(tmp_path, "align.method=ppo"), tmp_path)
