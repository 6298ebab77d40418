"""The one-pass bias (+ residual) add against ``bias_add_ref``: bit-equal per dtype and layout, forward-only dispatch."""

from __future__ import annotations

import pytest
import torch

from procap import kernels
from procap.kernels.residual import bias_add_ref
from tests.support import DTYPES, impl_device

pytestmark = pytest.mark.usefixtures("fresh_dispatch")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("residual", [False, True], ids=["x+b", "x+b+r"])
@pytest.mark.parametrize("channels_last", [True, False], ids=["nhwc", "nchw"])
@pytest.mark.parametrize("shape", [(2, 96, 5, 7), (1, 200, 3, 1)], ids=str)
def test_bias_add_equals_reference(dtype, residual, channels_last, shape):
    device = impl_device("triton")
    layout = torch.channels_last if channels_last else torch.contiguous_format
    x = (torch.randn(shape, device=device) * 3).to(dtype).contiguous(memory_format=layout)
    r = (torch.randn(shape, device=device) * 3).to(dtype).contiguous(memory_format=layout) if residual else None
    bias = torch.randn(shape[1], device=device)
    got = kernels.bias_add(x, bias, r, impl="triton")
    ref = bias_add_ref(x, bias, r)
    assert got.dtype == dtype and got.stride() == x.stride()
    assert torch.equal(got, ref)  # each add rounded to the storage dtype, in the reference's order


def test_an_input_that_requires_grad_runs_the_reference():
    x = torch.randn(2, 8, 3, 3, requires_grad=True)
    bias = torch.randn(8)
    out = kernels.bias_add(x, bias)
    out.sum().backward()
    assert kernels.chosen_impl("bias_add", "cpu", torch.float32, True) == "reference"
    assert torch.equal(x.grad, torch.ones_like(x))
    with pytest.raises(ValueError, match="no fused backward"):
        kernels.bias_add(x, bias, impl="triton")


def test_bad_shapes_raise():
    device = impl_device("triton")  # CPU tensors reach the Triton path only under the interpreter
    x = torch.randn(2, 8, 3, 3, device=device)
    with pytest.raises(ValueError, match="takes"):
        kernels.bias_add(x, torch.randn(7, device=device), impl="triton")
    with pytest.raises(ValueError, match="residual"):
        kernels.bias_add(x, torch.randn(8, device=device), x[:1], impl="triton")
