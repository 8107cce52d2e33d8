"""bench/trl_step.py's loss check on the tiny model: one fp32 step of slea's ppo_update (ppo_clip, token-mean) and of
the real TRL GRPOTrainer (loss_type dapo, beta 0) on the same weights, LoRA layers and batch give the same loss and
the same gradients."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoConfig

from slea.testing.bench import load_script
from slea.testing.numerics import assert_within, gradient_tolerance, tolerance

pytest.importorskip("trl", reason="trl is not installed (the bench extra: pip install -e '.[bench]')")

ROOT = Path(__file__).resolve().parents[2]


T = load_script(ROOT / "bench" / "trl_step.py")


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
    """Case 2 of slea.testing.numerics throughout: two libraries compute the same float32 function in their own
    layouts and reduction orders (TRL pads on the right and reduces its batched std in its own order)."""
    from slea.policy.model import load_tokenizer
    from slea.policy.tiny import tiny_model_dir

    config = AutoConfig.from_pretrained(tiny_model_dir())
    c = T.loss_check("tiny", shape)
    assert c["same_grad_tensors"] and c["trainable_tensors"] == 14  # 7 target modules x A, B on the top layer
    adv = T.grpo_advantages(T.REWARDS)
    max_adv = max(abs(a) for a in adv)
    # (r − mean) / (std + 1e-4) over G rewards: mean, difference, sum of squares, sqrt, division
    assert_within(c["advantages_abs_diff"], 0.0, tolerance("float32", scale=max_adv, stages=5, n=T.G),
                  why="advantages: TRL's batched float32 std against one group's")
    # at the first step ratio = 1 on both sides, so the loss is −token-mean(A): a float32 sum over the batch's
    # completion tokens of terms at most max|A|, in another order
    tokens = sum(len(c_) for _, c_ in T.batch(load_tokenizer("tiny"), shape))
    assert_within(c["loss_abs_diff"], 0.0, tolerance("float32", scale=max_adv, stages=2, n=tokens),
                  why="loss: token-mean of −A·ratio, two layouts")
    assert_within(c["grad_max_abs_diff"], 0.0, gradient_tolerance("float32", config, scale=c["grad_max_abs"]),
                  why="LoRA gradients: slea's prefix-shared left-padded forward against TRL's right-padded one")
    assert c["grad_norm_slea"] > 0
