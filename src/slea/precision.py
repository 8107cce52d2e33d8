"""The compute precision a run uses: ``model.dtype: auto | bfloat16 | float32``.

bf16 autocast pays only where the hardware computes bf16 natively: a CUDA GPU with bf16 support, or a CPU with
AVX-512-BF16 or AMX (oneDNN's bf16 kernels). Elsewhere PyTorch falls back to a reference GEMM: on an AVX2-only CPU
a bf16 matmul with its backward is about 30x slower than fp32 (bench/cpu_dtype.py), against 2.7x faster on a CPU
with AVX-512-BF16. ``auto`` (the default) therefore picks ``bfloat16`` where it is native and ``float32``
elsewhere; the run's saved config records the resolved value, so a resumed run keeps its precision.

The PPO ratio's π_old (``algorithm.old_logprobs``) follows the same numerics: :func:`resolve_old_logprobs`.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

DTYPES = ("auto", "bfloat16", "float32")
OLD_LOGPROBS = ("auto", "recompute", "rollout", "tis")


def resolve_dtype(setting: str, *, native_bf16: bool) -> str:
    """``model.dtype`` as a concrete autocast dtype: ``auto`` is ``bfloat16`` when the device computes bf16
    natively, else ``float32``; an explicit value is kept."""
    if setting not in DTYPES:
        raise ValueError(f"model.dtype: expected one of {', '.join(DTYPES)} (got {setting!r})")
    if setting != "auto":
        return setting
    return "bfloat16" if native_bf16 else "float32"


def cpu_native_bf16() -> bool:
    """Whether this CPU runs bf16 matmuls natively (AVX-512-BF16 or AMX, as oneDNN reports it)."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def device_native_bf16(device_spec: str) -> bool:
    """Whether the device ``run.device: device_spec`` resolves to (``auto``: CUDA when available) computes bf16
    natively."""
    import torch

    if device_spec != "cpu" and torch.cuda.is_available():
        return bool(torch.cuda.is_bf16_supported())
    return cpu_native_bf16()


def warn_if_slow(dtype: str, device_spec: str) -> None:
    """A warning when an explicit ``model.dtype: bfloat16`` runs on a CPU that emulates bf16."""
    if dtype == "bfloat16" and not device_native_bf16(device_spec):
        log.warning("model.dtype bfloat16 on a CPU without native bf16 (no AVX-512-BF16 or AMX): bf16 matmuls run "
                    "about 30x slower than float32 here; model.dtype: auto picks float32 on this machine")


def resolve_old_logprobs(setting: str, *, generator: str, device_type: str, dtype: str, base_dtype: str) -> str:
    """``algorithm.old_logprobs`` made concrete: ``auto`` is ``rollout`` (the generator's own log-probs, no extra
    forward) where generation and training are the same fp32 computation on the CPU — the in-process engine
    (``model.generator: hf``), ``model.dtype: float32``, fp32 base weights — and ``recompute`` everywhere else
    (bf16, CUDA, vLLM or a served model), where the two differ enough to clip tokens before any update. On the
    default job the fp32 CPU gap is mean |ρ−1| ≈ 3e-6 while ``recompute`` costs about a quarter of an iteration
    (bench/old_logprobs_cost.py). An explicit value is kept."""
    if setting not in OLD_LOGPROBS:
        raise ValueError(f"algorithm.old_logprobs: expected one of {', '.join(OLD_LOGPROBS)} (got {setting!r})")
    if setting != "auto":
        return setting
    same_numerics = (generator == "hf" and device_type == "cpu" and dtype == "float32"
                     and base_dtype in ("auto", "float32"))
    return "rollout" if same_numerics else "recompute"
