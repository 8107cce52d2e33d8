"""The one rule for numeric comparisons in tests: exact where both sides are the same computation, otherwise a
bound that follows from the dtype and from what is computed.

**Case 1: the same computation.** Both sides run the same kernels on the same inputs in the same layout: the
same dtype, the same shapes (batch rows, padding width, micro-batch split, shared prefix or not), the same device,
the same thread count, the same order of every reduction, and kernels that are deterministic (every CPU kernel
is, at a fixed thread count; on CUDA a kernel that accumulates with atomics, such as some attention backwards and
``index_add``, is not, unless ``torch.use_deterministic_algorithms`` is on). Then the results are bitwise equal on
every machine, whatever its ISA, because both sides round identically: assert equality with
:func:`assert_same`, never a tolerance, which would only hide a real difference. A test that relies on this
says so (``why=``) and names what makes the two sides the same computation. A bit-exact comparison across two
processes (a resumed run against an uninterrupted one) is case 1 only on the same CPU kind with the same thread
count: another ISA or thread count splits the reductions differently.

**Case 2: the same function, computed differently.** Another batch layout (padding, micro-batch composition, a
shared-prefix forward against a full one), another reduction order (gradients summed over shards, a float32 torch
sum against a float64 numpy sum), another library (TRL), another dtype, another kernel (AVX2's emulated bf16 GEMM,
oneDNN's AVX-512-BF16 or AMX kernels, cuBLAS). The two sides then differ by rounding, and the test asserts
:func:`assert_within` a :func:`tolerance`

    ``2 · stages · (u + n · u_acc) · scale``

* ``u``: the unit roundoff of the dtype each stage's result is rounded to: float32 2^-24, bfloat16 2^-8,
  float16 2^-11 (:data:`UNIT_ROUNDOFF`);
* ``u_acc``: the unit roundoff of the dtype the stage accumulates in: float32 for float32, bf16 and fp16 (every
  bf16 GEMM slea runs accumulates in float32: PyTorch's reference GEMM on AVX2, oneDNN's AVX-512-BF16 and AMX
  kernels, cuBLAS; fp32 matmuls on CUDA do not use TF32 unless a caller enables it, and slea does not);
* ``n``: the length of the longest reduction whose order the two sides may do differently (a dot product over
  the hidden width, a sum over a batch's tokens); ``n · u_acc`` is the first-order worst case of a length-n
  sum (Higham's γ_n);
* ``stages``: the rounded stages in sequence between the shared inputs and the compared value, each assumed to
  pass its input's relative error through without amplifying it (a normalised transformer layer nearly does;
  :func:`forward_stages` counts a decoder's);
* ``scale``: the magnitude of what is rounded or summed (the largest logit, the terms of a sum), not of the
  result: a sum that cancels keeps the absolute error of its terms;
* ``2``: both sides round, each within the bound of the exact value.

This is a worst case, so it holds for every ISA and device that rounds to the same dtypes by construction
(AVX2, AVX-512, AVX-512-BF16, AMX, CUDA), yet stays far below the difference a real defect makes (a dropped
gradient, a padding token attended to, dropout left on), which is of the order of the values themselves. Each
call site states which case it is in and why its ``n``, ``stages`` and ``scale`` are what they are.

Where an optimiser divides by a gradient's own magnitude (Adam), a rounding-level difference of a near-zero
gradient element becomes a step of up to ``lr``: no dtype bound covers the weights after such a step, so
comparisons of updates across layouts use plain SGD, whose step is linear in the gradient.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import torch

__all__ = [
    "LAYER_STAGES",
    "UNIT_ROUNDOFF",
    "assert_same",
    "assert_within",
    "exact_on",
    "forward_stages",
    "gradient_tolerance",
    "logprob_tolerance",
    "max_abs_diff",
    "numerics_dtype",
    "tolerance",
    "unit_roundoff",
]

UNIT_ROUNDOFF = {torch.float64: 2.0 ** -53, torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11,
                 torch.bfloat16: 2.0 ** -8}

# Rounded stages in sequence through one decoder layer: the q/k/v projections, the attention scores, the
# attention-weighted values, the output projection, gate/up, their activation product, the down projection.
LAYER_STAGES = 7


def _dtype(dtype: str | torch.dtype) -> torch.dtype:
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def unit_roundoff(dtype: str | torch.dtype) -> float:
    """u of ``dtype`` ("float32", "bfloat16", ... or a torch dtype)."""
    return UNIT_ROUNDOFF[_dtype(dtype)]


def tolerance(dtype: str | torch.dtype, *, scale: float, stages: int = 1, n: int = 1) -> float:
    """Case 2's bound ``2 · stages · (u + n · u_acc) · scale`` (see the module's docstring)."""
    d = _dtype(dtype)
    acc = torch.float64 if d == torch.float64 else torch.float32
    return 2.0 * stages * (UNIT_ROUNDOFF[d] + n * UNIT_ROUNDOFF[acc]) * abs(scale)


def forward_stages(layers: int) -> int:
    """Rounded stages in sequence through a decoder of ``layers`` layers and its LM head."""
    return LAYER_STAGES * layers + 1


def logprob_tolerance(dtype: str | torch.dtype, config, *, max_logit: float) -> float:
    """Case 2 for one token's log-prob under a decoder with HF ``config`` (``num_hidden_layers``, ``hidden_size``,
    ``intermediate_size``, ``vocab_size``), computed two ways (another batch layout, kernel or order): twice the
    logits' error (the target's logit and the log-sum-exp's), each through :func:`forward_stages` rounded stages
    in ``dtype`` with reductions of at most the widest layer, relative to the largest logit; plus the float32
    log-softmax, a reduction over the vocabulary V of values no larger than |log p| <= ln V + 2·max|logit|."""
    width = max(config.hidden_size, config.intermediate_size)
    return (2 * tolerance(dtype, scale=max_logit, stages=forward_stages(config.num_hidden_layers), n=width)
            + tolerance("float32", scale=math.log(config.vocab_size) + 2 * max_logit, n=config.vocab_size))


def gradient_tolerance(dtype: str | torch.dtype, config, *, scale: float) -> float:
    """Case 2 for a gradient element of a decoder with HF ``config`` computed two ways (another layout,
    micro-batching or summation order): the forward's and the backward's :func:`forward_stages` in ``dtype``,
    reductions of at most the widest layer, relative to ``scale`` (the gradient's size: its largest element, or a
    norm, which is no smaller)."""
    width = max(config.hidden_size, config.intermediate_size)
    return tolerance(dtype, scale=scale, stages=2 * forward_stages(config.num_hidden_layers), n=width)


def numerics_dtype() -> str:
    """The dtype the dtype-generic numerics tests compute in: ``SLEA_TEST_DTYPE`` (``float32`` unless set; ``make
    test-numerics`` runs them once more with ``bfloat16``). Their bounds follow from it."""
    dtype = os.environ.get("SLEA_TEST_DTYPE", "float32")
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"SLEA_TEST_DTYPE: float32 or bfloat16, got {dtype!r}")
    return dtype


def exact_on(device: str | torch.device) -> bool:
    """Whether the same computation is bitwise reproducible on ``device`` without extra settings: on the CPU yes
    (at a fixed thread count); on CUDA only under ``torch.use_deterministic_algorithms`` (atomics otherwise)."""
    return torch.device(device).type == "cpu" or torch.are_deterministic_algorithms_enabled()


def _flat(x) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().reshape(-1).to("cpu", torch.float64)
    if isinstance(x, dict):
        return torch.cat([_flat(x[k]) for k in sorted(x)]) if x else torch.zeros(0, dtype=torch.float64)
    if isinstance(x, Sequence) and not isinstance(x, str):
        return torch.cat([_flat(v) for v in x]) if len(x) else torch.zeros(0, dtype=torch.float64)
    return torch.tensor([float(x)], dtype=torch.float64)


def max_abs_diff(actual, expected) -> float:
    """The largest |actual − expected| over numbers, tensors, sequences or dicts of them (same structure)."""
    a, b = _flat(actual), _flat(expected)
    if a.shape != b.shape:
        raise AssertionError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    return float((a - b).abs().max()) if a.numel() else 0.0


def assert_same(actual, expected, *, why: str) -> None:
    """Case 1: bitwise equality (tensors: same dtype and shape, equal elements; NaN never equals). ``why``: what
    makes the two sides the same computation."""
    if isinstance(actual, torch.Tensor) or isinstance(expected, torch.Tensor):
        same = (isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor)
                and actual.dtype == expected.dtype and torch.equal(actual, expected))
    elif isinstance(actual, dict) and isinstance(expected, dict):
        if actual.keys() != expected.keys():
            raise AssertionError(f"keys differ: {sorted(actual)} vs {sorted(expected)} ({why})")
        for k in actual:
            assert_same(actual[k], expected[k], why=f"{why}; {k}")
        return
    elif isinstance(actual, (list, tuple)) and isinstance(expected, (list, tuple)):
        if len(actual) != len(expected):
            raise AssertionError(f"lengths differ: {len(actual)} vs {len(expected)} ({why})")
        for i, (a, b) in enumerate(zip(actual, expected)):
            assert_same(a, b, why=f"{why}; [{i}]")
        return
    else:
        same = actual == expected
    if not same:
        try:
            gap = f"max |Δ| {max_abs_diff(actual, expected):.3g}"
        except (AssertionError, TypeError, ValueError):
            gap = f"{actual!r} vs {expected!r}"
        raise AssertionError(f"not bitwise equal ({gap}), though the same computation: {why}")


def assert_within(actual, expected, tol: float, *, why: str) -> None:
    """Case 2: ``max |actual − expected| <= tol`` (a :func:`tolerance`). ``why``: which layout, order or kernel
    differs, and where the bound's terms come from."""
    if not (tol >= 0 and math.isfinite(tol)):
        raise ValueError(f"tolerance must be finite and >= 0, got {tol}")
    gap = max_abs_diff(actual, expected)
    if not gap <= tol:  # NaN fails
        raise AssertionError(f"max |Δ| {gap:.3g} > bound {tol:.3g}: {why}")
