"""``conv_in`` as a Triton convolution that writes the first norm's statistics, against its references.

Three references: ``F.conv2d`` + ``group_norm_ref`` (``conv_in_norm_ref``, the op's truth), today's fused path
(the 8-channel cuDNN-style convolution + the GroupNorm statistics kernel with ``in_bias``), and fp64. The
convolution's output must equal the reference's up to where a different fp32 summation order crosses a rounding
boundary; the per-chunk statistics must be those of the stored output; the norm's output must be as close to the fp64
truth as the references are.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from procap import kernels
from procap.kernels import conv_in
from procap.kernels.groupnorm import group_norm_from_partial_stats
from tests.support import DTYPES, impl_device, max_abs_err

pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning"),  # the interpreter's sigmoid
    pytest.mark.usefixtures("fresh_dispatch"),
]

# (batch, in channels, height, width, out channels, layout): odd sizes, batch 1, the padded input's 8 channels, and
# channel counts off the 32-channel tile (48: a full tile and a masked one; 112: three full and a masked one).
GEOMETRIES = [
    (1, 3, 7, 9, 48, torch.channels_last),
    (3, 3, 6, 5, 112, torch.contiguous_format),
    (2, 8, 5, 11, 128, torch.channels_last),
]


def _inputs(batch, c_in, height, width, channels, layout, dtype, device):
    images = torch.rand(batch, c_in, height, width, device=device).to(dtype).contiguous(memory_format=layout)
    weight = (torch.randn(channels, c_in, 3, 3, device=device) * 0.4).to(dtype)
    bias = (torch.randn(channels, device=device) * 2).to(dtype)
    return images, weight, bias


def _rounding_tolerance(dtype: torch.dtype, *magnitudes: torch.Tensor) -> float:
    """Two roundings (the convolution's, the bias add's) of values up to the largest of ``magnitudes``."""
    scale = max(float(t.abs().max()) for t in magnitudes)
    return 2 * torch.finfo(dtype).eps * scale if dtype != torch.float32 else 1e-5 * scale


def _chunk_stats(s: torch.Tensor, rows_per_chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp64 per-chunk channel means and M2 of s, (B, chunks, C): the layout the statistics pass writes."""
    flat = s.double().flatten(2).transpose(1, 2)  # (B, HW, C)
    means, m2s = [], []
    for chunk in flat.split(rows_per_chunk, dim=1):
        mean = chunk.mean(1)
        means.append(mean)
        m2s.append(((chunk - mean[:, None]) ** 2).sum(1))
    return torch.stack(means, 1), torch.stack(m2s, 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "x".join(str(v) for v in g[:5]))
@pytest.mark.parametrize("tiling", [(16, 32), (64, None)], ids=["16rows,32perchunk", "default"])
def test_convolution_and_statistics_match_the_reference(dtype, geometry, tiling):
    *shape, layout = geometry
    images, weight, bias = _inputs(*shape, layout, dtype, impl_device("triton"))
    block_hw, rows_per_chunk = tiling
    s, part_mean, part_m2, rows = conv_in.conv_in_stats(
        images, weight, bias, block_hw=block_hw, rows_per_chunk=rows_per_chunk
    )
    h = F.conv2d(images, weight, None, 1, 1)  # the bias-free convolution, rounded to the dtype, then the eager add
    ref = h + bias.view(1, -1, 1, 1)
    assert s.dtype == dtype and s.shape == ref.shape and s.is_contiguous(memory_format=layout)
    assert max_abs_err(s, ref) <= _rounding_tolerance(dtype, h, ref)
    if dtype != torch.float32:  # the same two roundings in the same order: most values are equal bit for bit
        assert (s == ref).double().mean() >= 0.9
    chunks = -(-shape[2] * shape[3] // rows)
    assert part_mean.shape == part_m2.shape == (shape[0], chunks, shape[4]) and part_mean.dtype == torch.float32
    mean, m2 = _chunk_stats(s, rows)  # the statistics are those of the stored output
    torch.testing.assert_close(part_mean.double(), mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(part_m2.double(), m2, rtol=1e-4, atol=1e-4 * float(m2.abs().max()))


def _todays_path(images, weight, bias, norm_weight, norm_bias, groups):
    """The fused encoder's path without the option: the input padded to 8 channels, the bias-free convolution, and
    the first norm adding the bias (its statistics pass writing the sum) through the Triton GroupNorm."""
    padded = torch.cat([images, images.new_zeros(images.shape[0], 5, *images.shape[2:])], 1)
    padded_weight = torch.cat([weight, weight.new_zeros(weight.shape[0], 5, 3, 3)], 1)
    h = F.conv2d(padded, padded_weight, None, 1, 1)
    return kernels.group_norm(
        h, norm_weight, norm_bias, groups, 1e-6, True, None, "triton", in_bias=bias, return_sum=True
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 9, 7), (3, 11, 13)], ids=lambda s: "b{}_{}x{}".format(*s))
def test_conv_in_norm_matches_the_references(dtype, shape):
    batch, height, width = shape
    images, weight, bias = _inputs(batch, 3, height, width, 128, torch.channels_last, dtype, impl_device("triton"))
    norm_weight, norm_bias = torch.randn(128, device=images.device), torch.randn(128, device=images.device)
    args = (norm_weight, norm_bias, 32, 1e-6, True)
    y, s = kernels.conv_in_norm(images, weight, bias, *args, impl="triton")
    y_ref, s_ref = kernels.conv_in_norm(images, weight, bias, *args, impl="reference")
    y_today, s_today = _todays_path(images, weight, bias, norm_weight, norm_bias, 32)
    y_true, s_true = conv_in.conv_in_norm_ref(images.double(), weight.double(), bias.double(), *args)
    assert y.shape == s.shape == (batch, 128, height, width) and y.dtype == s.dtype == dtype
    assert y.is_contiguous(memory_format=torch.channels_last)
    tolerance = _rounding_tolerance(dtype, s_true)
    assert max_abs_err(s, s_ref) <= tolerance and max_abs_err(s, s_today) <= tolerance
    # One rounding at the end: at most about the references' own error against fp64 (as the fused GroupNorm's test)
    for other in (y_ref, y_today):
        assert max_abs_err(y, y_true) <= 2 * max_abs_err(other, y_true) + 2e-5


def test_the_statistics_layout_is_checked():
    images, weight, bias = _inputs(1, 3, 5, 5, 32, torch.channels_last, torch.float32, impl_device("triton"))
    s, part_mean, part_m2, rows = conv_in.conv_in_stats(images, weight, bias, block_hw=16, rows_per_chunk=16)
    ones = torch.ones(32, device=s.device)
    assert part_mean.shape[1] == 2  # 25 rows: 16 + 9
    with pytest.raises(ValueError, match="partial statistics"):
        group_norm_from_partial_stats(s, part_mean, part_m2, 8, ones, ones, 8, 1e-6, True)  # 4 chunks of 8 rows
    with pytest.raises(ValueError, match="partial statistics"):
        group_norm_from_partial_stats(s, part_mean.half(), part_m2, rows, ones, ones, 8, 1e-6, True)


def test_bad_inputs_raise():
    device = impl_device("triton")
    images, weight, bias = _inputs(1, 3, 5, 5, 32, torch.channels_last, torch.float32, device)
    with pytest.raises(ValueError, match="weight"):
        conv_in.conv_in_stats(images, weight[:, :2], bias)
    with pytest.raises(ValueError, match="weight"):
        conv_in.conv_in_stats(images, weight[..., :2], bias)
    with pytest.raises(ValueError, match="bias"):
        conv_in.conv_in_stats(images, weight, bias[:31])
    with pytest.raises(ValueError, match="dtype"):
        conv_in.conv_in_stats(images, weight.half(), bias)
    many = torch.rand(1, 17, 5, 5, device=device)
    with pytest.raises(ValueError, match="at most 16 input channels"):
        conv_in.conv_in_stats(many, torch.rand(32, 17, 3, 3, device=device), bias)


def test_an_input_that_requires_grad_runs_the_reference():
    images, weight, bias = _inputs(2, 3, 5, 6, 32, torch.channels_last, torch.float32, torch.device("cpu"))
    weight.requires_grad_(True)
    norm = (torch.ones(32), torch.zeros(32), 8, 1e-6, True)
    y, s = kernels.conv_in_norm(images, weight, bias, *norm)
    assert kernels.chosen_impl("conv_in_norm", "cpu", torch.float32, True) == "reference"
    (y.sum() + s.sum()).backward()
    expected = torch.autograd.grad(sum(t.sum() for t in conv_in.conv_in_norm_ref(images, weight, bias, *norm)), weight)
    torch.testing.assert_close(weight.grad, expected[0])
    with pytest.raises(ValueError, match="no fused backward"):
        kernels.conv_in_norm(images, weight, bias, *norm, impl="triton")
