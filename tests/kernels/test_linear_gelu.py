"""The GEMM with the bias + erf GELU epilogue (``procap.kernels.linear_gelu``, the encoder MLP's ``fc1``) against its
reference, ``F.gelu(F.linear(...))``: every dtype, shapes off the tile, one row; the GELU is the erf one."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

from procap import kernels
from tests.support import DTYPES, impl_device, max_abs_err

pytestmark = pytest.mark.usefixtures("fresh_dispatch")
linear_gelu_module = importlib.import_module("procap.kernels.linear_gelu")  # the package attribute is the function


def _inputs(m, k, n, dtype, scale=1.0):
    generator = torch.Generator().manual_seed(m * 1000 + k + n)
    x = torch.randn(m, k, generator=generator) * scale
    weight = torch.randn(n, k, generator=generator) / k**0.5
    bias = torch.randn(n, generator=generator) * 0.5
    return [t.to(dtype).to(impl_device("triton")) for t in (x, weight, bias)]


def _truth(x, weight, bias):
    """The erf GELU of the linear map in fp64: what both implementations round."""
    return F.gelu(F.linear(x.double(), weight.double(), bias.double()))


# (M, K, N): rows, columns and K off the interpreter's 32 tile (and off sm_90's 128 / 64); one row; exact tiles
@pytest.mark.parametrize("shape", [(37, 70, 100), (1, 33, 65), (64, 32, 32)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_kernel_matches_the_reference(shape, dtype):
    x, weight, bias = _inputs(*shape, dtype)
    got = kernels.linear_gelu(x, weight, bias, impl="triton")
    ref = kernels.linear_gelu_ref(x, weight, bias)
    assert got.shape == ref.shape == (shape[0], shape[2]) and got.dtype == dtype
    truth = _truth(x, weight, bias)
    # The same two roundings as the reference (after the bias, after the GELU); only the GEMM's order differs.
    assert max_abs_err(got, truth) <= 2 * max_abs_err(ref, truth) + 1e-6
    if dtype == torch.float32:
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_the_gelu_is_the_erf_one_not_the_tanh_one():
    # Pre-activations over [-4, 4], where the flavours differ by up to ~5e-4: in fp32 the kernel sits on erf.
    x, weight, bias = _inputs(48, 40, 50, torch.float32, scale=3.0)
    got = kernels.linear_gelu(x, weight, bias, impl="triton").double()
    erf = _truth(x, weight, bias)
    tanh = F.gelu(F.linear(x.double(), weight.double(), bias.double()), approximate="tanh")
    assert max_abs_err(erf, tanh) > 1e-4  # the inputs tell the flavours apart
    assert max_abs_err(got, erf) < 1e-5


def test_the_bias_is_added_before_the_gelu():
    x, weight, bias = _inputs(5, 16, 20, torch.float32)
    without = kernels.linear_gelu(x, weight, torch.zeros_like(bias), impl="triton")
    torch.testing.assert_close(without, F.gelu(x @ weight.t()), rtol=1e-5, atol=1e-5)
    assert max_abs_err(without, kernels.linear_gelu(x, weight, bias, impl="triton")) > 0.1


def test_mismatched_arguments_are_refused():
    x, weight, bias = _inputs(4, 8, 12, torch.float32)
    with pytest.raises(ValueError, match="weight \\(N, K\\)"):
        linear_gelu_module.linear_gelu_triton(x, weight[:, :7], bias)
    with pytest.raises(ValueError, match="in one dtype"):
        linear_gelu_module.linear_gelu_triton(x, weight.half(), bias)


def test_the_dispatch_picks_triton_on_cuda_and_the_reference_for_gradients():
    assert kernels.chosen_impl("linear_gelu", "cuda", torch.bfloat16) == "triton"
    assert kernels.chosen_impl("linear_gelu", "cpu", torch.bfloat16) == "reference"  # no C++ version: no warning
    with pytest.warns(RuntimeWarning, match="no fused backward"):
        assert kernels.chosen_impl("linear_gelu", "cuda", torch.float32, requires_grad=True) == "reference"
