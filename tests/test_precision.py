"""``model.dtype: auto`` (slea/precision.py): bf16 only where the device computes it natively."""

from __future__ import annotations

import logging

import pytest
import yaml

import slea.precision as P
from slea.config import build_config, dump_config, load_config


def test_resolve_dtype_by_hand():
    assert P.resolve_dtype("auto", native_bf16=True) == "bfloat16"
    assert P.resolve_dtype("auto", native_bf16=False) == "float32"
    for explicit in ("bfloat16", "float32"):
        for native in (True, False):
            assert P.resolve_dtype(explicit, native_bf16=native) == explicit
    with pytest.raises(ValueError, match="model.dtype"):
        P.resolve_dtype("fp16", native_bf16=True)


@pytest.mark.parametrize(("native", "want"), [(True, "bfloat16"), (False, "float32")])
def test_a_config_with_auto_records_the_resolved_dtype(monkeypatch, tmp_path, native, want):
    monkeypatch.setattr(P, "device_native_bf16", lambda spec: native)
    cfg = build_config({"model": {"name_or_path": "tiny"}})
    assert cfg.model.dtype == want
    saved = tmp_path / "config.yaml"
    saved.write_text(dump_config(cfg))
    assert yaml.safe_load(saved.read_text())["model"]["dtype"] == want
    monkeypatch.setattr(P, "device_native_bf16", lambda spec: not native)  # resumed on other hardware
    assert load_config(saved).model.dtype == want  # the run keeps its precision


def test_an_explicit_dtype_is_kept_and_bf16_on_an_emulating_cpu_warns(monkeypatch, caplog):
    monkeypatch.setattr(P, "device_native_bf16", lambda spec: False)
    with caplog.at_level(logging.WARNING, logger="slea.precision"):
        assert build_config({"model": {"dtype": "float32"}}).model.dtype == "float32"
        assert not caplog.records
        assert build_config({"model": {"dtype": "bfloat16"}}).model.dtype == "bfloat16"
    assert "30x slower" in caplog.text


def test_an_explicit_bf16_base_computes_in_bf16(monkeypatch):
    monkeypatch.setattr(P, "device_native_bf16", lambda spec: False)
    assert build_config({"model": {"base_dtype": "bfloat16"}}).model.dtype == "bfloat16"


def test_cpu_probe_agrees_with_onednn():
    import torch

    assert P.cpu_native_bf16() == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert P.device_native_bf16("cpu") == P.cpu_native_bf16()


def test_resolve_old_logprobs_by_hand():
    fp32_cpu = {"generator": "hf", "device_type": "cpu", "dtype": "float32", "base_dtype": "auto"}
    assert P.resolve_old_logprobs("auto", **fp32_cpu) == "rollout"
    assert P.resolve_old_logprobs("auto", **{**fp32_cpu, "base_dtype": "float32"}) == "rollout"
    for other in ({"generator": "vllm"}, {"generator": "openai"}, {"device_type": "cuda"}, {"dtype": "bfloat16"},
                  {"base_dtype": "bfloat16"}):
        assert P.resolve_old_logprobs("auto", **{**fp32_cpu, **other}) == "recompute", other
    for explicit in ("recompute", "rollout", "tis"):
        assert P.resolve_old_logprobs(explicit, **{**fp32_cpu, "dtype": "bfloat16"}) == explicit
    with pytest.raises(ValueError, match="algorithm.old_logprobs"):
        P.resolve_old_logprobs("trainer", **fp32_cpu)


@pytest.mark.parametrize(("dtype", "want"), [("float32", "rollout"), ("bfloat16", "recompute")])
def test_a_config_records_the_resolved_old_logprobs_and_a_resumed_run_keeps_it(monkeypatch, tmp_path, dtype, want):
    monkeypatch.setattr(P, "device_native_bf16", lambda spec: dtype == "bfloat16")
    cfg = build_config({"model": {"name_or_path": "tiny"}, "run": {"device": "cpu"}})
    assert (cfg.model.dtype, cfg.algorithm.old_logprobs) == (dtype, want)
    saved = tmp_path / "config.yaml"
    saved.write_text(dump_config(cfg))
    assert yaml.safe_load(saved.read_text())["algorithm"]["old_logprobs"] == want
    monkeypatch.setattr(P, "device_native_bf16", lambda spec: dtype != "bfloat16")  # resumed on other hardware
    assert load_config(saved).algorithm.old_logprobs == want
    explicit = build_config({"run": {"device": "cpu"}, "algorithm": {"old_logprobs": "recompute"}})
    assert explicit.algorithm.old_logprobs == "recompute"
