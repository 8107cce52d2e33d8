"""bench/gpu_check.py's logic on the CPU (``--device cpu``, small shapes): every step runs and records what the GPU
run will report, with values that could be wrong (the gpu tests all skip here, the summary names the device, the
fp32 rollout/trainer gap is numerics only, the 7B-shaped memory probe's three variants, the one-rank FSDP smoke's
sharded update equals the unsharded one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from slea.testing.bench import load_script

G = load_script(Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py")


def test_the_flop_count_s_weights_by_hand():
    arch = {"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1}
    # per layer: q and o 8x8, k and v 8x4 (1 kv head of width 4), gate/up/down 8x16
    assert G.linear_weights(arch) == 2 * (64 * 2 + 32 * 2 + 128 * 3)
    q = G.QWEN["1.5b"]  # Qwen2.5-1.5B: 1.31e9 decoder weights (1.54e9 with the tied 151936 x 1536 embedding)
    assert abs(G.linear_weights(q) + q["vocab_size"] * q["hidden_size"] - 1.54e9) < 0.01e9


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_step_runs_on_the_cpu_and_writes_one_json(tmp_path):
    out = tmp_path / "gpu_check.json"
    res = G.main(["--device", "cpu", "--out", str(out), "--iterations", "1"])
    assert json.loads(out.read_text())["steps"].keys() == set(G.STEPS)
    steps = res["steps"]
    assert all(s["ok"] for s in steps.values()), {k: s.get("error") for k, s in steps.items()}
    assert steps["env"]["cache_kwarg"] is True
    tests = steps["gpu_tests"]
    assert tests["returncode"] == 0 and tests["tests"] >= 10 and tests["failed"] == []
    if not torch.cuda.is_available():
        assert tests["skipped"] == tests["tests"]  # no GPU here: every gpu test is skipped, none fails
    for dtype, bound in (("float32", 1e-4), ("bfloat16", 0.05)):
        run = steps["train"][dtype]
        assert run["returncode"] == 0 and run["rows"] == 1 and run["finite"] and run["device"] == "cpu"
        assert run["precision"]["training"] == dtype and run["ratio_dev_onpolicy"] == 0.0  # π_old recomputed
        assert 0 <= run["mismatch_dev_mean"] < bound
    probe = steps["probe_1p5b"]
    assert probe["generation_new_tokens_per_s"] > 0 and probe["train_tokens_per_s"] > 0
    assert 0 < probe["train_mfu"] and probe["finite"] and probe["logprob_rises_every_call"]
    mem = steps["memory_7b"]
    for variant in ("fp32_base", "bf16_base", "bf16_base_checkpointing"):
        assert mem[variant]["grads_finite"] and mem[variant]["seconds"] > 0
    assert mem["bf16_base"]["weights_gib"] < mem["fp32_base"]["weights_gib"]
    smoke = steps["fsdp_smoke"]
    assert smoke["backend"] == "gloo" and smoke["lora_devices"] == ["cpu"] and smoke["shard_devices"] == ["cpu"]
    assert smoke["moved"] > 1e-3 and smoke["max_abs_diff"] < 1e-5 and smoke["gathered"] == [0]
