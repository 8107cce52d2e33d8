"""bench/compile_step.py: which submodules each variant compiles, and one run of the tiny model whose compiled
(MLP and RMSNorm) step gives eager's log-probs within the bf16 bound, compiles nothing more once warm, and whose
JSON holds what the table reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from slea.testing.bench import load_script
from slea.testing.numerics import assert_within

M = load_script(Path(__file__).resolve().parents[2] / "bench" / "compile_step.py")


def test_compile_targets():
    model, _ = M.mfu.policy_with("tiny", 1, "bf16_linears")
    layers = model.get_base_model().model.layers
    assert M.compile_targets(model, "eager") == []
    assert M.compile_targets(model, "layers") == list(layers)
    got = M.compile_targets(model, "mlp_norm")  # each layer's MLP, its two norms, and the final norm
    assert got[:len(layers)] == [layer.mlp for layer in layers]
    norms = {id(m) for layer in layers for m in (layer.input_layernorm, layer.post_attention_layernorm)}
    assert {id(m) for m in got[len(layers):]} == norms | {id(model.get_base_model().model.norm)}
    # the adapted layer's MLP holds peft's LoRA layers, compiled with it
    assert any(hasattr(m, "lora_A") for m in layers[-1].mlp.modules())
    with pytest.raises(ValueError, match="unknown variant"):
        M.compile_targets(model, "everything")


@pytest.mark.slow  # inductor compiles the tiny model's MLP and norms: ~40 s
def test_compiled_step_of_the_tiny_model(tmp_path):
    out = tmp_path / "compile_step.json"
    res = M.main(["--model", "tiny", "--steps", "1", "--warmup", "1", "--variants", "mlp_norm",
                  "--threads", str(torch.get_num_threads()), "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))
    assert set(res["variants"]) == {"eager", "mlp_norm"}
    assert res["variants"]["mlp_norm"]["compiled_modules"] == 3 * 2 + 1  # 2 layers: MLP + 2 norms; final norm
    assert res["timed_rounds_compile"]["graphs"] == 0  # warm: the timed steps compile nothing
    assert res["variants"]["mlp_norm"]["dynamo_warnings"] == []  # no recompile limit hit, no fallback
    for shape in ("grpo", "multiturn"):
        eager, comp = (res["variants"][v]["batches"][shape] for v in ("eager", "mlp_norm"))
        assert eager["speedup"] == 1.0 and comp["speedup"] == pytest.approx(eager["step_s"] / comp["step_s"])
        assert eager["compile"]["graphs"] == 0 and eager["old_equals_train"]
        assert "max_abs_dlogprob" not in eager  # the reference
        assert comp["compile"]["graph_breaks"] == {} and len(comp["warmup_s"]) == 1 and comp["step_s"] > 0
        # case 2 of slea.testing.numerics: inductor's fused kernels against eager's, bf16 stages
        assert_within(max(comp["max_abs_dlogprob"].values()), 0.0, res["logprob_bound"][shape],
                      why="inductor's fused MLP and norm kernels against eager's, bf16")
        assert comp["within_bound"]
        assert 0 <= res["eager_plain_vs_trie_dlogprob"][shape] <= res["logprob_bound"][shape]  # the noise floor
        assert f"| {shape} | mlp_norm |" in res["table"]
    assert res["variants"]["mlp_norm"]["batches"]["grpo"]["compile"]["graphs"] > 0  # it did compile
