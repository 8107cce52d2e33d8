"""bench/trl_step.py's loss check on the tiny model: one fp32 step of slea's ppo_update (ppo_clip, token-mean) and of
the real TRL GRPOTrainer (loss_type dapo, beta 0) on the same weights, LoRA layers and batch give the same loss and
the same gradients."""

from __future__ import annotations

from pathlib import Path

import pytest

from slea.testing.bench import load_bench

pytest.importorskip("trl", reason="trl is not installed (the bench extra: pip install -e '.[bench]')")

ROOT = Path(__file__).resolve().parents[2]


T = load_bench("trl_step")


def test_batches_have_the_two_shapes():
    from slea.policy.model import load_tokenizer

    tok = load_tokenizer("tiny")
    grpo, multi = T.batch(tok, "grpo"), T.batch(tok, "multiturn")
    assert len(grpo) == len(multi) == T.G
    assert len({tuple(p) for p, _ in grpo}) == 1  # G completions of one prompt
    assert len({tuple(p) for p, _ in multi}) == T.G  # distinct prompts (histories, observations)
    assert all(1 <= len(c) <= 16 for _, c in grpo + multi)


@pytest.mark.parametrize("shape", T.SHAPES)
def test_slea_loss_and_gradients_equal_trl(shape):
    c = T.loss_check("tiny", shape)
    assert c["same_grad_tensors"] and c["trainable_tensors"] == 14  # 7 target modules x A, B on the top layer
    assert c["advantages_abs_diff"] < 1e-6  # TRL computes them in float32 (2.4e-7 apart on an AVX-512 CPU without AMX)
    assert c["loss_abs_diff"] < 1e-6
    assert c["grad_rel_diff"] < 1e-5
    assert c["grad_norm_slea"] > 0
