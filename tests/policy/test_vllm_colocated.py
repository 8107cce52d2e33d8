"""vLLM beside the trainer on one GPU, checked without a GPU: the memory-fraction check, the server's flags and
environment per backend and rank, and the trainer's sleep → update → wake_up → LoRA sync order, run against
``slea serve`` (whose /sleep and /wake_up are no-ops that record the calls)."""

from __future__ import annotations

import itertools
import sys
import tempfile
import threading

import pytest

from slea.config import ConfigError, ModelSection, build_config
from slea.policy.vllm_server import (
    GIB,
    ServedMemory,
    _child_env,
    check_memory_fraction,
    child_visible_devices,
    enforce_eager,
    model_arch,
    served_memory,
    server_command,
    sleeps,
    trainer_resident_bytes,
)

# Qwen2.5-7B (config.json): 28 layers, 4 KV heads of 128, ~7.6e9 weights; LoRA on q, k, v, o, gate, up, down
QWEN7B = {"params": 7_615_616_512, "layers": 28, "kv_heads": 4, "head_dim": 128,
          "lora_in_out": (3584 + 3584) * 2 + (3584 + 512) * 2 + (3584 + 18944) * 3}


def test_served_memory_by_hand():
    need = served_memory(QWEN7B, dtype_bytes=2, max_model_len=4096, lora_rank=16, lora_modules=7)
    assert need.weights == 7_615_616_512 * 2  # 15.2 GB of bf16 weights
    assert need.kv_one_sequence == 2 * 28 * 4 * 128 * 2 * 4096  # K and V, every layer: 224 MiB
    assert need.lora == 16 * QWEN7B["lora_in_out"] * 28 * 2
    assert need.total == need.weights + need.kv_one_sequence + need.lora + need.overhead


def test_a_fraction_that_cannot_hold_the_server_is_refused_with_the_fraction_it_needs():
    need = ServedMemory(weights=15 * GIB, kv_one_sequence=GIB // 4, lora=GIB // 4, overhead=GIB)
    with pytest.raises(ConfigError, match=r"gpu_memory_utilization: 0.2 of 80.0 GiB is 16.0 GiB; the server "
                                          r"needs about 16.5 GiB .* at least 0.22"):
        check_memory_fraction(0.2, 80 * GIB, need)
    check_memory_fraction(0.25, 80 * GIB, need)  # 20 GiB: fits
    # the trainer beside it keeps 50 GiB: 0.5 leaves 40 GiB, too little; at most (80 - 50 - 1) / 80 = 0.36
    with pytest.raises(ConfigError, match=r"0.5 leaves 40.0 GiB .* keeps about 50.0 GiB .* at most 0.36"):
        check_memory_fraction(0.5, 80 * GIB, need, trainer_bytes=50 * GIB)
    check_memory_fraction(0.3, 80 * GIB, need, trainer_bytes=50 * GIB)


def test_a_7b_server_with_a_large_share_of_an_80_gb_card_leaves_room_for_a_bf16_base_only():
    need = served_memory(QWEN7B, dtype_bytes=2, max_model_len=4096, lora_rank=16, lora_modules=7)
    lora = 16 * QWEN7B["lora_in_out"] * 28
    fp32 = trainer_resident_bytes(QWEN7B, base_bytes=4, lora_params=lora)  # 28.4 GiB of weights + 0.6 LoRA
    bf16 = trainer_resident_bytes(QWEN7B, base_bytes=2, lora_params=lora)  # 14.2 GiB + 0.6
    # 0.7 of 80 GiB leaves 24 GiB: under the fp32 trainer's 29 + 1.5, above the bf16 one's 14.8 + 1.5
    with pytest.raises(ConfigError, match="model.base_dtype: bfloat16 halves"):
        check_memory_fraction(0.7, 80 * GIB, need, trainer_bytes=fp32)
    check_memory_fraction(0.7, 80 * GIB, need, trainer_bytes=bf16)


def test_model_arch_reads_the_config_without_allocating():
    arch = model_arch(ModelSection(name_or_path="tiny", lora_targets=["q_proj", "v_proj"]))
    from slea.policy.model import load_policy

    model, _ = load_policy(ModelSection(name_or_path="tiny", lora=False))
    c = model.config
    assert arch["params"] == sum(p.numel() for p in model.parameters())
    assert arch["layers"] == c.num_hidden_layers and arch["kv_heads"] == c.num_key_value_heads
    head_dim = c.hidden_size // c.num_attention_heads
    assert arch["lora_in_out"] == (c.hidden_size * 2 + c.hidden_size + c.num_key_value_heads * head_dim)


def test_enforce_eager_and_sleep_by_backend():
    assert enforce_eager(None, "cpu") and not enforce_eager(None, "cuda")
    assert enforce_eager(True, "cuda") and not enforce_eager(False, "cpu")
    assert sleeps(None, "cuda", colocated=True) and not sleeps(None, "cuda", colocated=False)
    assert not sleeps(None, "cpu", colocated=False) and not sleeps(False, "cuda", colocated=True)
    with pytest.raises(ConfigError, match="model.vllm.sleep: vLLM's sleep mode needs its CUDA backend"):
        sleeps(True, "cpu", colocated=False)


def test_server_flags_and_environment_per_backend_and_rank(monkeypatch):
    cfg = ModelSection(name_or_path="/models/x", lora_r=16)
    cpu = server_command(cfg, 8000)
    assert "--enforce-eager" in cpu and "--enable-sleep-mode" not in cpu
    gpu = server_command(cfg, 8000, backend="cuda", sleep=True)
    assert "--enforce-eager" not in gpu and "--enable-sleep-mode" in gpu
    assert dict(itertools.pairwise(gpu[3:]))["--gpu-memory-utilization"] == "0.2"
    cfg.vllm.enforce_eager = True
    assert "--enforce-eager" in server_command(cfg, 8000, backend="cuda")
    assert child_visible_devices(None, 3) == "3"
    assert child_visible_devices("4,5,6,7", 1) == "5"  # rank 1 of a node whose parent sees GPUs 4-7
    assert child_visible_devices("", 2) == "2"
    for k, v in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "x", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(k, v)
    env = _child_env(None, visible="5", sleep=True)
    assert env["CUDA_VISIBLE_DEVICES"] == "5" and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert not {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"} & set(env)
    assert "VLLM_SERVER_DEV_MODE" not in _child_env(None)


def test_vllm_is_allowed_with_several_processes_and_openai_is_not():
    from slea.parallel.checks import check_data_parallel
    from slea.parallel.distributed import DataParallel

    cfg = build_config({"rollout": {"groups": 4}})
    check_data_parallel(cfg.model_copy(update={"model": cfg.model.model_copy(update={"generator": "vllm"})}),
                        DataParallel(0, 2))  # one server per rank
    with pytest.raises(ConfigError, match="model.generator: openai serves one process's weights"):
        check_data_parallel(cfg.model_copy(update={"model": cfg.model.model_copy(update={"generator": "openai"})}),
                            DataParallel(0, 2))


@pytest.mark.timeout(600)
def test_the_trainer_sleeps_the_server_for_each_update_and_wakes_it_before_the_lora_sync(tmp_path):
    from slea.policy.server import ServeSettings, load_engine, make_server
    from slea.trainer.rl import Trainer

    engine = load_engine("tiny", dtype="float32")
    server = make_server(engine, "127.0.0.1", 0, ServeSettings(lora_dir=tempfile.gettempdir()))  # the syncs' folder
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cfg = build_config({
            "run": {"seed": 0, "threads": 1, "dir": str(tmp_path / "run")},
            "model": {"name_or_path": "tiny", "dtype": "float32", "lora_r": 4, "lora_alpha": 8,
                      "lora_targets": ["q_proj", "v_proj"], "generator": "openai",
                      "openai": {"base_url": f"http://127.0.0.1:{server.server_address[1]}/v1", "sleep": True}},
            "env": {"id": "slea/Sokoban-v0", "max_steps": 2},
            "rollout": {"groups": 2, "group_size": 2, "max_new_tokens": 4, "fuzzy_cutoff": 0.3},
            "train": {"iterations": 2},
            "eval": {"before": False, "games": 1, "episodes_per_game": 1, "greedy": False},
        })
        trainer = Trainer(cfg)
        try:
            trainer.fit()
        finally:
            trainer.close()
    finally:
        server.shutdown()
        server.server_close()
    kinds = {"POST /sleep?level=1": "sleep", "POST /wake_up": "wake", "POST /v1/load_lora_adapter": "sync",
             "POST /v1/completions": "generate"}
    events = [kinds[c] for c in engine.calls if c in kinds]
    order = [k for k, _ in itertools.groupby(events)]  # runs of generation requests as one
    assert order == ["sync", "generate", "sleep", "wake", "sync", "generate", "sleep", "wake", "sync",
                     "generate"], engine.calls
    assert not engine.sleeping


def test_sleep_is_refused_for_a_vllm_generator_with_openai_settings():
    with pytest.raises(ConfigError, match="model.openai.sleep: set by model.generator vllm"):
        build_config({"model": {"generator": "vllm", "vllm": {"python": sys.executable},
                                "openai": {"sleep": True}}})
