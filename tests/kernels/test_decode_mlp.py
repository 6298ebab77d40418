"""The decoding step's MLP in one kernel (``procap.kernels.decode_mlp``) against its reference, the step's path
before it (``F.linear``, ``F.gelu``, ``F.linear``): every dtype, sizes off the tiles, one row and two row blocks, and
the workspace's counters left at zero so that the next launch (or a graph replay) sums again."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

from procap import kernels
from tests.support import DTYPES, impl_device, max_abs_err

pytestmark = pytest.mark.usefixtures("fresh_dispatch")
decode_mlp_module = importlib.import_module("procap.kernels.decode_mlp")  # the package attribute is the function


def _inputs(batch, dim, hidden, dtype):
    generator = torch.Generator().manual_seed(batch * 1000 + dim + hidden)
    x = torch.randn(batch, dim, generator=generator)
    fc1_weight = torch.randn(hidden, dim, generator=generator) * 1.5 / dim**0.5
    fc1_bias = torch.randn(hidden, generator=generator) * 0.5
    fc2_weight = torch.randn(dim, hidden, generator=generator) / hidden**0.5
    fc2_bias = torch.randn(dim, generator=generator) * 0.5
    device = impl_device("triton")
    tensors = [t.to(dtype).to(device) for t in (x, fc1_weight, fc1_bias, fc2_weight, fc2_bias)]
    return tensors + list(kernels.decode_mlp_workspace(batch, dim, hidden, device))


def _truth(x, fc1_weight, fc1_bias, fc2_weight, fc2_bias, *_):
    hidden = F.gelu(F.linear(x.double(), fc1_weight.double(), fc1_bias.double()))
    return F.linear(hidden, fc2_weight.double(), fc2_bias.double())


# (B, D, F): 5 rows, dims and hidden units off every interpreter tile (16 / 32); one row; 18 rows = two row blocks
# of 16, the hidden size a multiple of the slice
@pytest.mark.parametrize("shape", [(5, 40, 100), (1, 24, 70), (18, 33, 64)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_kernel_matches_the_reference(shape, dtype):
    args = _inputs(*shape, dtype)
    got = kernels.decode_mlp(*args, impl="triton")
    ref = kernels.decode_mlp_ref(*args)
    assert got.shape == ref.shape == shape[:2] and got.dtype == dtype
    truth = _truth(*args)
    # The hidden activation rounded as the reference stores it; only the GEMMs' fp32 summation order differs. In
    # half precision a hidden value may round the other way, one ulp of the hidden activation times a weight.
    assert max_abs_err(got, truth) <= 2 * max_abs_err(ref, truth) + 1e-6
    if dtype == torch.float32:
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(args[-1], torch.zeros_like(args[-1]))  # every row block's counter back at zero


def test_a_second_launch_sums_again_and_gives_the_same_bits():
    # The last program of a row block resets its counter: a second launch on the same workspace (a graph replay)
    # sums its own partials, in split order, so the bits repeat; new inputs give new outputs.
    args = _inputs(18, 33, 100, torch.float32)
    first = kernels.decode_mlp(*args, impl="triton")
    assert torch.equal(kernels.decode_mlp(*args, impl="triton"), first)
    args[0] = args[0] * 2
    second = kernels.decode_mlp(*args, impl="triton")
    torch.testing.assert_close(second, kernels.decode_mlp_ref(*args), rtol=1e-5, atol=1e-5)


def test_the_gelu_is_the_erf_one():
    args = _inputs(3, 16, 40, torch.float32)
    args[0] = args[0] * 3  # pre-activations of a few units, where erf and tanh differ by ~1e-4
    got = kernels.decode_mlp(*args, impl="triton").double()
    x, fc1_weight, fc1_bias, fc2_weight, fc2_bias = (t.double() for t in args[:5])
    tanh = F.linear(F.gelu(F.linear(x, fc1_weight, fc1_bias), approximate="tanh"), fc2_weight, fc2_bias)
    assert max_abs_err(_truth(*args), tanh) > 1e-4
    assert max_abs_err(got, _truth(*args)) < 1e-5


def test_mismatched_workspaces_and_weights_are_refused():
    args = _inputs(5, 16, 40, torch.float32)
    small = list(kernels.decode_mlp_workspace(4, 16, 40, args[0].device))
    with pytest.raises(ValueError, match="decode_mlp_workspace\\(5, 16, 40\\)"):
        decode_mlp_module.decode_mlp_triton(*args[:5], *small)
    with pytest.raises(ValueError, match="must fit"):
        decode_mlp_module.decode_mlp_triton(args[0], args[1][:, :15], *args[2:])
    with pytest.raises(ValueError, match="in x's dtype"):
        decode_mlp_module.decode_mlp_triton(args[0], args[1].half(), *args[2:])


def test_the_dispatch_picks_triton_on_cuda_and_the_reference_for_gradients():
    assert kernels.chosen_impl("decode_mlp", "cuda", torch.bfloat16) == "triton"
    with pytest.warns(RuntimeWarning, match="no fused backward"):
        assert kernels.chosen_impl("decode_mlp", "cuda", torch.float32, requires_grad=True) == "reference"
