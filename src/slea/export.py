"""``slea export RUN DIR``: a trained run's policy as a plain Hugging Face model folder.

The run's model (``model.name_or_path``) is loaded on the CPU in fp32, its last usable checkpoint's trainable
weights are loaded into it, and a LoRA policy's adapters are merged into the base weights (``W + (α/r)·B·A``),
so the folder holds one ordinary causal LM: ``config.json``, ``generation_config.json``, ``model.safetensors``
(safetensors only) and the tokenizer's files with its chat template. ``transformers.AutoModelForCausalLM`` and
vLLM load it as they are, with no slea and no peft. The weights are written in ``dtype``: ``auto`` is the base
checkpoint's own dtype (``torch_dtype`` in its config.json; fp32 for the embedded and tiny models), or
``float32`` / ``bfloat16``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from slea.config import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def export_dtype(setting: str, checkpoint_dtype: torch.dtype | str | None) -> torch.dtype:
    """The dtype of the exported weights: ``auto`` = the base checkpoint's (fp32 when it names none or an unknown
    one), else the named one."""
    if setting != "auto":
        if setting not in DTYPES:
            raise ConfigError(f"export: --dtype {setting!r}: expected auto, float32 or bfloat16")
        return DTYPES[setting]
    if isinstance(checkpoint_dtype, str):
        checkpoint_dtype = DTYPES.get(checkpoint_dtype)
    return checkpoint_dtype if checkpoint_dtype in DTYPES.values() else torch.float32


def merged_policy(run: str | Path, checkpoint: str | None = None, say=None):
    """``(model, tokenizer, cfg)``: the run's policy with its newest usable checkpoint (or ``checkpoint``, a name
    under its checkpoints/) loaded and LoRA merged, fp32, CPU; ``say`` gets one line per damaged newer checkpoint
    skipped."""
    from slea.algorithms.registry import get_algorithm
    from slea.config import load_config
    from slea.policy.model import load_policy
    from slea.runs.checkpoint import run_checkpoint
    from slea.runs.folder import RunFolder

    run = Path(run)
    if not RunFolder(run).is_run():
        raise ConfigError(f"export: {run} is not a run folder (no config.yaml)")
    cfg = load_config(RunFolder(run).config, check_unused=False)
    if "team" in get_algorithm(cfg.algorithm.name).needs:
        raise ConfigError(f"export: {run} is a team run (one LoRA adapter per agent on one base model); only a "
                          f"single policy is exported")
    last = run_checkpoint(run, checkpoint, say=say)  # CheckpointError when the run's weights are not on this machine
    mcfg = cfg.model.model_copy(update={"init_from": None})
    model, tok = load_policy(mcfg, adapter_dir=last, device="cpu", base_dtype=torch.float32)
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    model.eval()
    return model, tok, cfg


def export_run(run: str | Path, out: str | Path, *, dtype: str = "auto", checkpoint: str | None = None,
               say=None) -> Path:
    """Write the merged policy of ``run`` to the folder ``out`` (created; an existing non-empty folder is
    refused). ``checkpoint``/``say``: as :func:`merged_policy`. Returns ``out``."""
    from slea.policy.model import resolve

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"export: {out} exists and is not an empty folder")
    model, _, cfg = merged_policy(run, checkpoint, say)
    from transformers import AutoConfig

    base_dtype = getattr(AutoConfig.from_pretrained(resolve(cfg.model.name_or_path)), "dtype", None)
    model = model.to(export_dtype(dtype, base_dtype))
    model.config.use_cache = True
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    from transformers import AutoTokenizer

    # the base's tokenizer as it is (slea's loader pads left and may add a pad token: its own conventions)
    AutoTokenizer.from_pretrained(resolve(cfg.model.tokenizer or cfg.model.name_or_path)).save_pretrained(out)
    if not (out / "config.json").is_file():
        raise RuntimeError(f"export: transformers wrote no config.json to {out}")
    return out
