"""The GPU presets (configs/gpu_*.yaml) load and keep the protocol they name: verl-agent's GiGPO ALFWorld one
(Qwen2.5-1.5B-Instruct, 16 tasks x 8 rollouts, 50 env steps, 150 training steps) for gigpo, grpo and slea, and
the Search-QA one for RTPO and tlm-DRE; on a GPU their base weights are bf16, on this machine fp32 on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from slea.config import load_config
from slea.device import resolve_base_dtype, resolve_device

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("algo", ["gigpo", "grpo", "slea"])
def test_the_alfworld_presets_follow_the_gigpo_protocol(algo):
    cfg = load_config(CONFIGS / f"gpu_{algo}_alfworld.yaml")
    assert cfg.algorithm.name == algo
    assert cfg.model.name_or_path == "Qwen/Qwen2.5-1.5B-Instruct" and cfg.model.lora
    assert (cfg.rollout.groups, cfg.rollout.group_size, cfg.env.max_steps, cfg.train.iterations) == (16, 8, 50, 150)
    assert cfg.env.id == "slea/ALFWorld-v0" and cfg.rollout.invalid_penalty == 0.1
    assert cfg.algorithm.kl_coef == 0.01 and cfg.algorithm.kl_estimator == "low_var_kl"
    assert not cfg.algorithm.std_norm  # mean_norm
    if algo != "grpo":
        assert cfg.algorithm.gamma == 0.95 and cfg.algorithm.step_weight == 1.0
    assert (cfg.experience.mode == "step") == (algo == "slea")
    others = {a: load_config(CONFIGS / f"gpu_{a}_alfworld.yaml") for a in ("gigpo", "grpo", "slea")}
    for other in others.values():  # the three differ in the algorithm (and slea's library) only
        assert other.model == cfg.model and other.env == cfg.env and other.rollout == cfg.rollout
        assert other.train == cfg.train and other.eval == cfg.eval


def test_the_searchqa_preset_serves_rtpo_and_tlm_dre():
    cfg = load_config(CONFIGS / "gpu_searchqa.yaml")
    assert cfg.algorithm.name == "rtpo" and cfg.align.method == "tlm_dre"
    assert cfg.env.id == "slea/SearchQA-v0" and cfg.model.name_or_path == "Qwen/Qwen2.5-7B-Instruct"
    assert cfg.train.gradient_checkpointing


@pytest.mark.parametrize("name", ["gpu_gigpo_alfworld", "gpu_grpo_alfworld", "gpu_slea_alfworld", "gpu_searchqa"])
def test_a_preset_runs_its_model_in_bf16_on_a_gpu_and_in_fp32_here(name):
    cfg = load_config(CONFIGS / f"{name}.yaml")
    assert cfg.run.device == "auto" and cfg.model.base_dtype == "auto" and cfg.model.dtype == "bfloat16"
    gpu = resolve_device(cfg.run.device, cuda_available=True, cuda_count=8, local_rank=3, world=8)
    assert gpu == "cuda:3"
    assert resolve_base_dtype(cfg.model.base_dtype, device=gpu, lora=True, dtype=cfg.model.dtype) == torch.bfloat16
    cpu = resolve_device(cfg.run.device, cuda_available=False, cuda_count=0)
    assert resolve_base_dtype(cfg.model.base_dtype, device=cpu, lora=True, dtype=cfg.model.dtype) == torch.float32
