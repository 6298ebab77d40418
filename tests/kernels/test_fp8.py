"""FP8 (e4m3) numerics of ``procap.kernels.fp8`` against hand-computed values and the plain PyTorch references."""

from __future__ import annotations

import pytest
import torch

from procap.core.errors import ProCapError
from procap.kernels import add_layer_norm_ref, fp8


def test_e4m3_grid_points_round_trip_and_ties_go_to_even():
    scale = torch.ones(1, 1)
    exact = torch.tensor([[0.0, 1.0, 1.125, 240.0, 256.0, 448.0, -448.0, 2.0**-9, 2.0**-6]])
    assert torch.equal(fp8.quantize(exact, scale).float(), exact)
    # 1.0625 lies halfway between 1.0 and 1.125: to even (1.0); 1.1875 between 1.125 and 1.25: to even (1.25).
    # 2**-10 is halfway between 0 and the smallest subnormal 2**-9: to even (0); 3 * 2**-10 goes to 2 * 2**-9.
    ties = torch.tensor([[1.0625, 1.1875, 2.0**-10, 3 * 2.0**-10, -(2.0**-10)]])
    assert fp8.quantize(ties, scale).float().tolist() == [[1.0, 1.25, 0.0, 2.0**-8, -0.0]]


def test_values_beyond_448_saturate_and_nan_stays_nan():
    scale = torch.ones(1, 1)
    codes = fp8.quantize(torch.tensor([[449.0, 464.0, 1e6, -1e30, float("inf"), float("nan")]]), scale).float()
    assert codes[0, :5].tolist() == [448.0, 448.0, 448.0, -448.0, 448.0]
    assert torch.isnan(codes[0, 5])


def test_per_row_scales_are_amax_over_448():
    x = torch.tensor([[1.0, -896.0, 3.0], [0.5, 0.25, -0.125], [0.0, 0.0, 0.0]])
    rows = fp8.quantize_rows(x)
    assert rows.scale.shape == (3, 1)
    assert rows.scale[:2, 0].tolist() == [2.0, pytest.approx(0.5 / 448, rel=1e-7)]  # fp32 division
    assert rows.scale[2, 0] == fp8.MIN_SCALE  # an all-zero row: codes 0, never 0 / 0
    assert rows.codes.float()[0].tolist() == [0.5, -448.0, 1.5]  # 1/2 and 3/2 exact on the e4m3 grid
    assert rows.codes.float()[1, 0] == 448.0  # every row's amax lands on 448
    assert torch.equal(fp8.dequantize(rows)[2], torch.zeros(3))
    # Dequantised, each element is within half an e4m3 step (3 mantissa bits: 2**-4 relative) of the input.
    assert torch.allclose(fp8.dequantize(rows), x, rtol=2**-4, atol=0)


def test_tiny_rows_keep_their_relative_precision():
    x = torch.tensor([[1e-30, -3e-31, 5e-32]])  # far below e4m3's subnormals: the scale carries the magnitude
    rows = fp8.quantize_rows(x)
    assert torch.allclose(fp8.dequantize(rows), x, rtol=2**-4)
    subnormal_row = torch.tensor([[1e-40, 0.0]])  # an fp32 subnormal amax: the scale is clamped, codes stay finite
    codes = fp8.quantize_rows(subnormal_row).codes.float()
    assert torch.isfinite(codes).all() and codes[0, 1] == 0


def test_a_non_finite_activation_row_dequantises_to_nan_and_leaves_other_rows_alone():
    x = torch.tensor([[1.0, float("inf"), 2.0], [1.0, float("nan"), 2.0], [1.0, 2.0, 4.0]])
    values = fp8.dequantize(fp8.quantize_rows(x))
    assert torch.isnan(values[:2]).all()
    assert values[2].tolist() == [1.0, 2.0, 4.0]


def test_weights_are_scaled_per_output_channel_and_non_finite_weights_are_refused():
    weight = torch.tensor([[0.1, -0.2, 0.4], [100.0, 50.0, -25.0]])
    quantized = fp8.quantize_weight(weight)
    assert quantized.scale[:, 0].tolist() == pytest.approx([0.4 / 448, 100.0 / 448])
    assert quantized.codes.float()[:, 0].tolist() == pytest.approx([112.0, 448.0])
    with pytest.raises(ProCapError, match="fc1.weight holds inf or NaN"):
        fp8.quantize_weight(torch.tensor([[1.0, float("nan")]]), "fc1.weight")


def test_the_reference_gemm_by_hand():
    x = fp8.Quantized(torch.tensor([[1.0, 2.0], [-4.0, 0.5]]).to(fp8.E4M3), torch.tensor([[0.5], [2.0]]))
    w = fp8.Quantized(
        torch.tensor([[3.0, 1.0], [0.0, -2.0], [1.5, 1.5]]).to(fp8.E4M3), torch.tensor([[1.0], [0.25], [4.0]])
    )
    bias = torch.tensor([1.0, 0.0, -1.0])
    # Row 0: scale 0.5 * [1, 2]; row 1: 2 * [-4, 0.5]. Weights: [3, 1], 0.25 * [0, -2], 4 * [1.5, 1.5].
    expected = torch.tensor(
        [[0.5 * 5 + 1, 0.5 * 0.25 * -4, 0.5 * 4 * 4.5 - 1], [2 * -11.5 + 1, 2 * 0.25 * -1, 2 * 4 * -5.25 - 1]]
    )
    out = fp8.fp8_linear_ref(x, w, bias, torch.float32)
    assert torch.equal(out, expected)
    assert fp8.fp8_linear_ref(x, w, bias, torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_linear_is_close_to_the_full_precision_linear(dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 64, generator=gen).to(dtype)
    weight, bias = torch.randn(32, 64, generator=gen) * 0.05, torch.randn(32, generator=gen)
    out = fp8.fp8_linear(x, fp8.quantize_weight(weight), bias.to(dtype))
    exact = x.float() @ weight.t() + bias
    assert out.shape == (2, 5, 32) and out.dtype == dtype
    rel = (out.float() - exact).norm() / exact.norm()
    assert 1e-3 < rel < 0.05  # quantised (not exact), yet a few per cent at most


def test_scaled_mm_takes_the_arguments_as_given_and_matches_the_reference():
    """``torch._scaled_mm`` of the CPU build: the call's layout, scales and bias as the GPU gets them."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(48, 64, generator=gen).bfloat16()
    weight = fp8.quantize_weight(torch.randn(32, 64, generator=gen))
    bias = torch.randn(32, generator=gen).bfloat16()
    try:
        fast = fp8.fp8_linear(x, weight, bias, impl="scaled_mm")
    except (RuntimeError, NotImplementedError) as exc:  # a torch build without the CPU kernel
        pytest.skip(f"torch._scaled_mm is not available on this CPU build: {exc}")
    reference = fp8.fp8_linear(x, weight, bias, impl="reference")
    assert fast.dtype == reference.dtype == torch.bfloat16
    torch.testing.assert_close(fast.float(), reference.float(), rtol=2**-7, atol=1e-2)
    with pytest.raises(ValueError, match="unknown FP8 GEMM implementation 'cublas'"):
        fp8.fp8_linear(x, weight, bias, impl="cublas")


def test_scaled_mm_is_offered_only_where_it_runs():
    assert fp8.scaled_mm_problem(torch.device("cpu"), torch.bfloat16) == "cpu runs the reference"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_layer_norm_writing_e4m3_agrees_with_the_composition_of_the_references(dtype):
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(3, 7, 96, generator=gen) * 3).to(dtype)
    h = torch.randn(3, 7, 96, generator=gen).to(dtype)
    weight, bias = (
        (1 + 0.1 * torch.randn(96, generator=gen)).to(dtype),
        (0.1 * torch.randn(96, generator=gen)).to(dtype),
    )
    x_fused, x_ref = x.clone(), x.clone()
    fused = fp8.add_layer_norm_e4m3(x_fused, h, weight, bias, 1e-5)
    composed = fp8.quantize_rows(add_layer_norm_ref(x_ref, h, weight, bias, 1e-5))
    assert torch.equal(x_fused, x_ref)  # the stream is updated in place by both
    assert fused.codes.dtype == fp8.E4M3 and fused.scale.shape == (3, 7, 1)
    torch.testing.assert_close(fused.scale, composed.scale, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=0)
    steps = (fused.codes.float() - composed.codes.float()).abs() / composed.codes.float().abs().clamp_min(2**-6)
    assert steps.max() <= 2**-3 + 1e-6  # at most one e4m3 step (relative 2**-3) apart
    assert (fused.codes.float() == composed.codes.float()).float().mean() >= 0.95


def test_quantize_rows_into_and_dequantize_into_write_static_buffers():
    x = torch.randn(2, 3, 4, 8)
    codes, scale = torch.empty(2, 3, 4, 8, dtype=fp8.E4M3), torch.empty(2, 3, 4, 1)
    fp8.quantize_rows_into(x, codes, scale)
    out = torch.empty(2, 3, 4, 8, dtype=torch.bfloat16)
    assert fp8.dequantize_into(codes, scale, out) is out
    assert torch.equal(out, fp8.dequantize(fp8.quantize_rows(x)).bfloat16())
