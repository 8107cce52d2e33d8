"""bench/profile_step.py: the kinds its op table sorts profiler events into, and one profiled run of the tiny model
whose tables add up."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from pytest import approx

from slea.testing.bench import load_script

M = load_script(Path(__file__).resolve().parents[2] / "bench" / "profile_step.py")


def test_kinds_of_ops():
    assert M.kind_of("aten::mm") == M.kind_of("aten::addmm") == "matmul"
    assert M.kind_of("aten::_scaled_dot_product_flash_attention_for_cpu_backward") == "attention"
    assert M.kind_of("aten::copy_") == M.kind_of("aten::_to_copy") == "cast_copy"
    assert M.kind_of("aten::_log_softmax") == "softmax"
    assert M.kind_of("aten::_foreach_mul_") == M.kind_of("Optimizer.step#AdamW.step") == "optimizer"
    assert M.kind_of("aten::view") == M.kind_of("aten::empty_strided") == "alloc_view"
    assert M.kind_of("autograd::engine::evaluate_function: MmBackward0") == M.kind_of("MmBackward0") == "autograd"
    assert M.kind_of("aten::silu") == M.kind_of("aten::mul") == "elementwise"
    assert M.kind_of("some_python_range") == "other"


def test_profile_of_the_tiny_model(tmp_path):
    res = M.main(["--model", "tiny", "--reps", "1", "--new-tokens", "2", "--threads", str(torch.get_num_threads()),
                  "--out", str(tmp_path)])
    assert res["base_dtype"] == "bfloat16_linears"  # the CPU's default under bf16
    assert json.loads((tmp_path / "bfloat16_linears.json").read_text()) == json.loads(json.dumps(res))
    md = (tmp_path / "bfloat16_linears.md").read_text()
    assert "AVX-512-BF16" in res["cpu"] and res["cpu"] in md
    for shape in ("grpo", "multiturn"):
        for phase in M.PHASES:
            p = res["shapes"][shape][phase]
            assert f"## {shape} / {phase}" in md
            selfs = [o["self_s"] for o in p["ops"]]
            assert selfs == sorted(selfs, reverse=True) and sum(selfs) == approx(p["profiled_self_s"])
            assert sum(p["kinds"].values()) == approx(p["profiled_self_s"])
            assert p["kinds"]["matmul"] > 0 and p["kinds"]["attention"] > 0  # every phase runs the model
        # only the update runs a backward and an optimizer step
        assert res["shapes"][shape]["update"]["kinds"]["optimizer"] > 0
        assert res["shapes"][shape]["old_logprobs"]["kinds"]["optimizer"] == 0

