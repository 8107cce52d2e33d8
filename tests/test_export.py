"""``slea export RUN DIR``: a trained tiny run's policy as a plain Hugging Face folder that transformers loads
by itself (no peft, no slea), with the logits of the run's own policy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slea.config import ConfigError
from slea.export import export_dtype, export_run

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A one-iteration tiny run whose LoRA weights are made clearly non-zero (a merge then changes the base)."""
    from safetensors.torch import load_file, save_file

    from slea.runs.checkpoint import run_checkpoint, verify_checkpoint
    from slea.testing.tiny_run import tiny_slea_run

    folder = tiny_slea_run(tmp_path_factory.mktemp("export") / "run", iterations=1)
    last = run_checkpoint(folder)
    weights = load_file(str(last / "trainable.safetensors"))
    g = torch.Generator().manual_seed(0)
    save_file({k: torch.randn(v.shape, generator=g) * 0.2 for k, v in weights.items()},
              str(last / "trainable.safetensors"))
    import hashlib
    import json

    manifest = json.loads((last / "manifest.json").read_text())  # keep the checkpoint valid after the edit
    data = (last / "trainable.safetensors").read_bytes()
    manifest["files"]["trainable.safetensors"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (last / "manifest.json").write_text(json.dumps(manifest))
    verify_checkpoint(last)
    return folder


def test_the_exported_folder_loads_in_transformers_with_the_policys_logits(run, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slea.config import load_config
    from slea.policy.model import load_policy
    from slea.runs.checkpoint import run_checkpoint

    out = export_run(run, tmp_path / "hf")
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= names
    assert not any(n.endswith((".bin", ".pt", ".pkl")) or n.startswith("adapter_") for n in names)
    exported = AutoModelForCausalLM.from_pretrained(out, use_safetensors=True, dtype=torch.float32)
    assert not hasattr(exported, "peft_config") and type(exported).__name__.endswith("ForCausalLM")
    tok = AutoTokenizer.from_pretrained(out)
    policy, ptok = load_policy(load_config(run / "config.yaml").model, adapter_dir=run_checkpoint(run))
    assert tok.chat_template and tok.chat_template == ptok.chat_template  # the chat template travels along
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs, tokenize=False) == ptok.apply_chat_template(msgs, tokenize=False)
    ids = torch.tensor([tok("Goal: push the box. Your command:", add_special_tokens=False).input_ids])
    assert ids.tolist() == [ptok("Goal: push the box. Your command:", add_special_tokens=False).input_ids]
    with torch.no_grad():
        got, want = exported(input_ids=ids).logits, policy(input_ids=ids).logits
        with policy.disable_adapter():
            base = policy(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert (want - base).abs().max() > 1e-2  # the adapters moved the logits: the merge was exercised


def test_export_refuses_what_it_cannot_write(run, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(ConfigError, match="exists and is not an empty folder"):
        export_run(run, tmp_path / "full")
    with pytest.raises(ConfigError, match="not a run folder"):
        export_run(tmp_path, tmp_path / "out")
    assert export_dtype("auto", "bfloat16") == torch.bfloat16 and export_dtype("auto", None) == torch.float32
    assert export_dtype("float32", torch.bfloat16) == torch.float32
    with pytest.raises(ConfigError, match="--dtype"):
        export_dtype("fp8", None)


def test_cli_export_writes_the_folder_and_refuses_in_one_line(run, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))

    def slea(*args):
        return subprocess.run([sys.executable, "-m", "slea.cli", *args], check=False, capture_output=True,
                              text=True, env=env, timeout=600)

    r = slea("export", str(run), str(tmp_path / "hf"), "--dtype", "bfloat16")
    assert r.returncode == 0, r.stderr[-2000:]
    from safetensors import safe_open

    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}  # noqa: SIM118 (safe_open is not a dict)
    r = slea("export", str(tmp_path / "nothing"), str(tmp_path / "hf2"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "not a run folder" in r.stderr
