"""A bf16 training run with the frozen linears stored in bf16 (``model.base_dtype: bfloat16_linears``, the CPU's
default under bf16): the same run as with an fp32 base, and a killed-then-resumed run equal to the uninterrupted
one. Every "equal" is bitwise (case 1 of slea.testing.numerics): the same CPU kind and thread count on both sides,
and bf16 storage of a frozen weight is the tensor autocast would cast it to."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from slea.runs import checkpoint as ckpt
from slea.runs.runlog import read_metrics


class _Killed(Exception):
    pass


def _weights(run) -> dict[str, torch.Tensor]:
    return load_file(str(ckpt.latest_checkpoint(run / "checkpoints") / "trainable.safetensors"))


def _config(rel, base_dtype: str):
    return rel.tiny_config(model={"name_or_path": "tiny", "dtype": "bfloat16", "base_dtype": base_dtype, "lora": True,
                                  "lora_r": 4, "lora_alpha": 8}, train={"iterations": 3})


def test_bf16_linears_train_as_the_fp32_base_and_resume_bit_for_bit(tmp_path, rel):
    from slea.trainer.rl import Trainer

    cfg = _config(rel, "auto")
    ref = Trainer(cfg, run_dir=tmp_path / "ref")
    frozen = ref.model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    assert frozen.dtype == torch.bfloat16  # auto on the CPU under bf16: the linears stored in bf16
    ref.fit()
    fp32 = Trainer(_config(rel, "float32"), run_dir=tmp_path / "fp32")
    fp32.fit()
    want = read_metrics(tmp_path / "ref/metrics.jsonl")
    ref_w = _weights(tmp_path / "ref")
    # the run trains (LoRA B starts at 0): the comparisons below could fail
    assert any(r.get("update/grad_norm", 0.0) > 0 for r in want)
    assert any(float(v.abs().sum()) > 0 for k, v in ref_w.items() if "lora_B" in k)
    why = "same run, the base stored in fp32 (autocast casts each frozen weight to the bf16 tensor stored here)"
    rel.assert_same_metrics(read_metrics(tmp_path / "fp32/metrics.jsonl"), want)
    got = _weights(tmp_path / "fp32")
    assert got.keys() == ref_w.keys() and all(torch.equal(got[k], ref_w[k]) for k in ref_w), why

    run = tmp_path / "run"
    victim = Trainer(cfg, run_dir=run)
    real_log = victim.log.log

    def log_then_die(it, metrics):
        real_log(it, metrics)
        if it == 1:  # the row of iteration 1 is written, its checkpoint is not
            raise _Killed

    victim.log.log = log_then_die
    with pytest.raises(_Killed):
        victim.fit()
    victim.log.close()
    Trainer(cfg, run_dir=run).fit(resume=True)
    rel.assert_same_metrics(read_metrics(run / "metrics.jsonl"), want)
    got = _weights(run)
    assert got.keys() == ref_w.keys() and all(torch.equal(got[k], ref_w[k]) for k in ref_w)
