"""``run.device`` (slea/device.py): the pure resolution for every case, the backend of a device, the base
weights' dtype, and the CLI's one-line refusal of a device this machine does not have, before any model loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slea.config import ConfigError, build_config
from slea.device import (
    backend_for,
    model_device,
    resolve_base_dtype,
    resolve_base_storage,
    resolve_device,
    run_device,
)

ROOT = Path(__file__).resolve().parents[1]


def test_auto_is_the_local_ranks_gpu_when_there_is_one_else_the_cpu():
    assert resolve_device("auto", cuda_available=False, cuda_count=0) == "cpu"
    assert resolve_device("auto", cuda_available=True, cuda_count=8) == "cuda:0"
    assert resolve_device("auto", cuda_available=True, cuda_count=8, local_rank=5, world=8) == "cuda:5"
    assert resolve_device("cpu", cuda_available=True, cuda_count=8, local_rank=3, world=8) == "cpu"


def test_cuda_is_the_local_ranks_gpu_and_cuda_n_that_gpu():
    assert resolve_device("cuda", cuda_available=True, cuda_count=2, local_rank=1, world=2) == "cuda:1"
    assert resolve_device("cuda:1", cuda_available=True, cuda_count=2) == "cuda:1"


@pytest.mark.parametrize(("spec", "kw", "match"), [
    ("cuda", {"cuda_available": False, "cuda_count": 0}, r"run.device: cuda, but torch .* sees no CUDA device"),
    ("cuda:0", {"cuda_available": False, "cuda_count": 0}, "sees no CUDA device"),
    ("cuda:2", {"cuda_available": True, "cuda_count": 2}, r"run.device: cuda:2: cuda:2 is no GPU .*cuda:0..cuda:1"),
    ("cuda", {"cuda_available": True, "cuda_count": 2, "local_rank": 2, "world": 3},
     "local rank 2 has no GPU"),
    ("auto", {"cuda_available": True, "cuda_count": 1, "local_rank": 1, "world": 2}, "local rank 1 has no GPU"),
    ("cuda:0", {"cuda_available": True, "cuda_count": 8, "world": 2}, "puts all 2 data-parallel processes on one"),
    ("gpu", {"cuda_available": True, "cuda_count": 1}, "expected auto, cpu, cuda or cuda:N"),
])
def test_a_device_that_is_not_there_is_a_config_error_naming_run_device(spec, kw, match):
    with pytest.raises(ConfigError, match=match):
        resolve_device(spec, **kw)


def test_run_device_reads_torch_and_the_local_rank(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert run_device("auto") == torch.device("cuda:3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert run_device("auto") == torch.device("cpu")


def test_the_config_key_takes_the_four_forms_and_refuses_others():
    for spec in ("auto", "cpu", "cuda", "cuda:3"):
        assert build_config({"run": {"device": spec}}).run.device == spec
    with pytest.raises(ConfigError, match="run.device"):
        build_config({"run": {"device": "cuda:x"}})


def test_backend_of_a_device():
    assert backend_for("cpu") == "gloo"
    assert backend_for("cuda:3") == "cpu:gloo,cuda:nccl"
    assert backend_for(torch.device("cuda")) == "cpu:gloo,cuda:nccl"


def test_base_dtype_auto_is_bf16_only_for_lora_on_cuda_in_bf16():
    bf16, fp32 = torch.bfloat16, torch.float32
    assert resolve_base_dtype("auto", device="cpu", lora=True, dtype="bfloat16") == fp32  # CPU numerics kept
    # ... by storing only the frozen linears in bf16: the numbers autocast computes from fp32 ones
    assert resolve_base_storage("auto", device="cpu", lora=True, dtype="bfloat16") == "bfloat16_linears"
    assert resolve_base_storage("auto", device="cpu", lora=True, dtype="float32") == "float32"
    assert resolve_base_storage("auto", device="cpu", lora=False, dtype="bfloat16") == "float32"
    assert resolve_base_storage("auto", device="cuda:0", lora=True, dtype="bfloat16") == "bfloat16"
    assert resolve_base_dtype("bfloat16_linears", device="cpu", lora=True, dtype="bfloat16") == fp32  # then cast
    assert resolve_base_dtype("auto", device="cuda:0", lora=True, dtype="bfloat16") == bf16
    assert resolve_base_dtype("auto", device="cuda:0", lora=False, dtype="bfloat16") == fp32  # full FT trains it
    assert resolve_base_dtype("auto", device="cuda:0", lora=True, dtype="float32") == fp32
    assert resolve_base_dtype("bfloat16", device="cpu", lora=True, dtype="bfloat16") == bf16
    assert resolve_base_dtype("float32", device="cuda:1", lora=True, dtype="bfloat16") == fp32


def test_base_dtype_bf16_is_refused_where_it_cannot_mean_anything():
    with pytest.raises(ConfigError, match="model.base_dtype: bfloat16 .* model.lora: false"):
        build_config({"model": {"base_dtype": "bfloat16", "lora": False}})
    with pytest.raises(ConfigError, match="model.base_dtype: bfloat16 .* model.dtype: float32"):
        build_config({"model": {"base_dtype": "bfloat16", "dtype": "float32"}})


def test_model_device_is_where_the_parameters_are():
    assert model_device(torch.nn.Linear(2, 2)) == torch.device("cpu")
    assert model_device(torch.nn.Linear(2, 2, device="meta")) == torch.device("meta")
    assert model_device(torch.nn.ReLU()) == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: run.device=cuda is valid here")
@pytest.mark.parametrize("extra", [[], ["--nproc", "2"]])
def test_cli_refuses_cuda_without_cuda_in_one_line_before_any_model_loads(tmp_path, extra):
    """The model named does not exist: had it been loaded first, the error would be about it."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    r = subprocess.run([sys.executable, "-m", "slea.cli", "train", str(ROOT / "configs/smoke.yaml"), *extra,
                        "--set", "run.device=cuda", "--set", f"model.name_or_path={tmp_path / 'no-model'}",
                        "--set", f"run.dir={tmp_path / 'run'}"], check=False, capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "run.device: cuda, but torch" in r.stderr and "no-model" not in r.stderr
    assert not (tmp_path / "run").exists()
