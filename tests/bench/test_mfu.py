"""bench/mfu.py's FLOP count: the model-FLOPs formula against a count by hand on a 2-layer toy architecture, the
executed-FLOPs count equal to torch's FlopCounterMode on a real training step of the tiny model, and the JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from slea.testing.bench import load_script

M = load_script(Path(__file__).resolve().parents[2] / "bench" / "mfu.py")

# 2 layers, d 4, f 8, 2 query heads + 1 kv head of width 2, vocabulary 10; LoRA r1 on q and v of layer 1 only
TOY = M.Arch(layers=2, hidden=4, intermediate=8, heads=2, kv_heads=1, head_dim=2, vocab=10, rank=1,
             adapted=((), ("q_proj", "v_proj")))


def test_model_flops_by_hand():
    # one row of 3 tokens, no shared prefix, a 1-token response
    got = M.step_flops(TOY, [M.MicroBatch(prefix=0, rests=[3], responses=[1])], executed=False)
    p = 4 * 4 + 4 * 2 + 4 * 2 + 4 * 4 + 4 * 8 + 4 * 8 + 8 * 4  # q, k, v, o, gate, up, down: 144 frozen weights
    lora = 1 * (4 + 4) + 1 * (4 + 2)  # A and B of q and v
    pairs = 1 + 2 + 3  # causal (query, key) pairs of 3 tokens
    want = {
        "linear_fwd": 2 * 3 * p * 2, "lora_fwd": 2 * 3 * lora,
        "attention_fwd": 4 * 2 * 2 * pairs * 2,  # 4·hq·dh per pair per layer
        "head_fwd": 2 * 1 * 4 * 10, "head_bwd": 2 * 1 * 4 * 10,  # the response position only
        # backward through layer 1 only; its q, k, v read layer 0's output, which needs no gradient: no
        # grad-input for them (k: nothing at all), then o, gate, up, down grad-input (frozen: no weight grads)
        "linear_bwd": 2 * 3 * (4 * 4 + 4 * 8 + 4 * 8 + 8 * 4),
        # q and v adapters: weight grads of A (2·t·r·in) and B (2·t·r·out), grad-input of B (2·t·r·out); none of A
        "lora_bwd": 2 * 3 * (4 + 2 * 4) + 2 * 3 * (4 + 2 * 2),
        "attention_bwd": 8 * 2 * 2 * pairs,  # one layer, twice the forward
    }
    assert got == {**want, "total": sum(want.values())}
    assert got["total"] == 3148
    assert got["linear_fwd"] + got["lora_fwd"] == 2 * (TOY.layers * TOY.frozen_per_layer() + TOY.lora_params()) * 3


def test_shared_prefix_and_padding_in_the_executed_count():
    mb = M.MicroBatch(prefix=5, rests=[2, 4], responses=[1, 3])
    model = M.step_flops(TOY, [mb], executed=False)
    ex = M.step_flops(TOY, [mb], executed=True)
    assert model["head_fwd"] == 2 * 4 * 4 * 10  # 4 response tokens
    assert ex["head_fwd"] == 2 * (1 + 2 * 4) * 4 * 10  # the prefix's last position (logits_to_keep=1) + 2 rows x (k + 1)
    assert ex["linear_fwd"] == 2 * (5 + 2 * 4) * TOY.frozen_per_layer() * 2  # rows padded to width 4
    assert ex["attention_fwd"] == 4 * 2 * 2 * (5 * 5 + 2 * 4 * 9) * 2  # full rectangles
    assert model["attention_fwd"] == 4 * 2 * 2 * (15 + (2 * 5 + 3) + (4 * 5 + 10)) * 2


@pytest.mark.parametrize("lora_layers", [1, 2])
@pytest.mark.parametrize("shape", ["grpo", "multiturn"])
def test_executed_count_equals_flop_counter(shape, lora_layers):
    r, arch = M.measure_step("tiny", shape, lora_layers, steps=1, micro=8, count=True)
    assert sum(map(bool, arch.adapted)) == lora_layers and arch.rank == 16
    assert r["micro_batches"][0]["prefix"] > 0  # the prefix-shared path
    assert r["flop_counter"]["total"] == r["executed_flops"]["total"]
    # the LM head runs on each row's last k + 1 positions and on the prefix's last one only (logits_to_keep)
    kept = sum(len(mb["rests"]) * (max(mb["responses"]) + 1) + (1 if mb["prefix"] else 0) for mb in r["micro_batches"])
    assert r["executed_flops"]["head_fwd"] == 2 * kept * arch.hidden * arch.vocab  # and its total = the counter's


def test_json(tmp_path):
    out = tmp_path / "mfu.json"
    res = M.main(["--model", "tiny", "--steps", "1", "--matmul-seconds", "0.002", "--threads",
                  str(torch.get_num_threads()), "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))
    m = res["matmul"]
    assert m["peak_bf16_gflops"] == max(m["bf16_gflops"].values()) > 0 and m["peak_fp32_gflops"] > 0
    for shape in ("grpo", "multiturn"):
        r = res["steps"][shape]
        assert r["flop_counter"]["rel_diff_vs_executed"] == 0
        u = r["utilisation"]
        assert u["mfu_bf16"] > 0 and u["mfu_fp32"] > 0 and u["matmul_bound_s"] > 0
        # same time and peak: MFU / HFU = model FLOPs / executed FLOPs (model can exceed executed on the tiny
        # model, whose prefix skips the top layer's backward but whose model count does not credit that)
        assert u["mfu_bf16"] / u["hfu_bf16"] == pytest.approx(r["model_flops"]["total"] / r["executed_flops"]["total"])
        assert u["achieved_model_gflops"] == pytest.approx(r["model_flops"]["total"] / r["step_s"] / 1e9)
        assert r["weight_cast"]["forward_calls"] == 2 and r["weight_cast"]["s_per_forward"] > 0
        for storage in ("fp32_base", "frozen_bf16"):  # the same step with the base stored otherwise
            assert r[storage]["speedup"] == pytest.approx(r[storage]["step_s"] / r["step_s"])
            assert u[f"mfu_bf16_{storage}"] / u["mfu_bf16"] == pytest.approx(r["step_s"] / r[storage]["step_s"])
    gen = res["generation_frozen_bf16"]
    assert gen["new_tokens"] == 10 and all(gen[f"speedup/{s}/G={g}"] > 0 for g in (1, 16)
                                           for s in ("bf16_linears", "frozen_bf16"))
    assert res["arch"]["lora_params"] > 0 and "MFU (bf16 peak)" in res["table"]


def test_timed_calls_retakes_a_try_that_waited():
    import time

    calls = []

    def idle():  # sleeps: almost no CPU per wall second, as a step that waits for a core
        calls.append(1)
        time.sleep(0.01)

    t = M.timed_calls(idle, 2, min_cpu_per_wall=1.0, retries=2)
    assert t["tries"] == 3 and len(calls) == 6 and len(t["s_all"]) == 2 and t["cpu_per_wall"] < 0.5
    assert M.timed_calls(idle, 2)["tries"] == 1


def test_timed_rounds_interleave_the_variants():
    order = []
    t = M.timed_rounds({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, 3)
    assert order == ["a", "b"] * 3  # round by round, so a drift of the machine's speed hits both alike
    assert set(t) == {"a", "b"} and all(len(v["s_all"]) == 3 and v["tries"] == 1 for v in t.values())
