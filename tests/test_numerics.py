"""slea.testing.numerics, the tests' one tolerance rule: its bound by hand, and that each assertion fails where it
must."""

from __future__ import annotations

import pytest
import torch

from slea.testing.numerics import (
    assert_same,
    assert_within,
    forward_stages,
    max_abs_diff,
    tolerance,
    unit_roundoff,
)


def test_the_bound_by_hand():
    assert unit_roundoff("bfloat16") == 2.0 ** -8 and unit_roundoff(torch.float32) == 2.0 ** -24
    # 2 · stages · (u + n · u_acc) · scale; bf16 rounds its results but accumulates in float32
    assert tolerance("float32", scale=3.0, stages=2, n=10) == 2 * 2 * (11 * 2.0 ** -24) * 3.0
    assert tolerance("bfloat16", scale=1.0, n=100) == 2 * (2.0 ** -8 + 100 * 2.0 ** -24)
    assert tolerance("float32", scale=-2.0) == tolerance("float32", scale=2.0)
    assert forward_stages(2) == 15


def test_one_bf16_rounding_sits_inside_the_bound_and_a_real_change_does_not():
    x = torch.linspace(-3, 3, 101)
    rounded = x.to(torch.bfloat16).float()
    assert_within(rounded, x, tolerance("bfloat16", scale=float(x.abs().max())), why="one rounding to bf16")
    with pytest.raises(AssertionError, match="max |Δ| .* > bound"):
        assert_within(x * 1.01, x, tolerance("bfloat16", scale=float(x.abs().max())), why="a 1 % change")


def test_assert_same_is_bitwise():
    a = torch.tensor([1.0, 2.0])
    assert_same(a, a.clone(), why="a copy")
    assert_same({"w": [1.0, 2.0]}, {"w": [1.0, 2.0]}, why="lists")
    with pytest.raises(AssertionError, match="not bitwise equal .* the same computation: why"):
        assert_same(a, a + torch.tensor([0.0, 2.0 ** -22]), why="why")  # one float32 ulp at 2
    with pytest.raises(AssertionError):
        assert_same(a, a.double(), why="dtypes differ")
    with pytest.raises(AssertionError):
        assert_same(0.0, -2.86e-6, why="the issue's bf16 log-ratio")
    with pytest.raises(AssertionError):
        assert_within(float("nan"), 0.0, 1.0, why="NaN is never within")
    assert max_abs_diff([1.0, [2.0, 3.0]], [1.0, [2.0, 3.5]]) == 0.5


def test_the_isa_matrix_caps_each_level_this_cpu_has_and_adds_bf16_passes():
    from slea.testing.isa_matrix import passes

    avx2 = {"sse4_1", "avx2", "fma"}
    avx512 = avx2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}
    amx = avx512 | {"avx512_bf16", "amx_tile", "amx_bf16"}
    assert [(p.aten, p.onednn, p.dtype) for p in passes(avx2)] == [
        ("default", "SSE41", "float32"), ("avx2", "AVX2", "float32"), ("avx2", "AVX2", "bfloat16")]
    assert [p.name for p in passes(avx512)] == ["SSE41", "AVX2", "AVX512_CORE", "AVX512_CORE_VNNI", "AVX2 bf16",
                                                "AVX512_CORE_VNNI bf16"]
    assert passes(amx)[-1].onednn == "AVX512_CORE_AMX" and len(passes(amx)) == 8
    assert passes(set()) == []


def test_assert_same_walks_lists_of_tensors():
    a = [torch.ones(2), torch.zeros(3)]
    assert_same(a, [t.clone() for t in a], why="copies")
    with pytest.raises(AssertionError, match=r"\[1\]"):
        assert_same(a, [torch.ones(2), torch.full((3,), 1e-30)], why="the second differs")
