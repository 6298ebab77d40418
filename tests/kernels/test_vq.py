"""Every VQ lookup implementation against ``vq_nearest_ref``: exact where the answer is unambiguous, ties, near-ties."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from procap import kernels
from procap.kernels import _ext
from procap.kernels.vq import vq_distances_ref, vq_nearest_ref
from tests.support import DTYPES, impl_device, impl_params

IMPLS = impl_params("vq_nearest")
# (N, K, D): N and K off the block sizes, K not a power of two, D odd; one with several D tiles.
SHAPES = [(100, 123, 97), (70, 1000, 16), (33, 77, 200), (1, 1, 1)]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_well_separated_codes_exact(impl, dtype, shape):
    # Latents are codes plus small noise: the nearest code is unambiguous, so every impl must return it exactly.
    n_rows, n_codes, dim = shape
    device = impl_device(impl)
    codebook = (torch.randn(n_codes, dim) * 4).to(dtype)
    target = torch.randint(0, n_codes, (n_rows,))
    z = (codebook.float()[target] + 0.01 * torch.randn(n_rows, dim)).to(dtype)
    ref = vq_nearest_ref(z, codebook)
    assert torch.equal(ref, target)  # the data really is well separated
    got = kernels.vq_nearest(z.to(device), codebook.to(device), impl=impl)
    assert got.dtype == torch.int64 and got.device.type == device.type
    assert torch.equal(got.cpu(), ref)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_random_data_agrees_up_to_fp32_near_ties(impl, dtype):
    # Gaussian data has near-ties; an index may differ from the reference only when its reference distance is
    # within fp32 rounding of the reference's minimum (different summation order inside z.e).
    device = impl_device(impl)
    z = torch.randn(300, 64).to(dtype)
    codebook = torch.randn(1000, 64).to(dtype)
    ref = vq_nearest_ref(z, codebook)
    got = kernels.vq_nearest(z.to(device), codebook.to(device), impl=impl).cpu()
    dist = vq_distances_ref(z, codebook)
    rows = torch.arange(len(ref))
    gap = dist[rows, got] - dist[rows, ref]
    scale = z.float().pow(2).sum(1) + codebook.float().pow(2).sum(1)[got]
    assert torch.all(gap >= 0)
    assert torch.all(gap <= 1e-5 * scale)
    assert (got != ref).sum() <= 3


@pytest.mark.parametrize("impl", IMPLS)
def test_ties_go_to_the_lowest_index(impl):
    # Small integers: every distance is exact in fp32 whatever the summation order, so ties are real ties.
    device = impl_device(impl)
    codebook = torch.randint(-3, 4, (1000, 16)).float()
    codebook[[70, 400, 999]] = codebook[5].clone()  # duplicates in later tiles
    codebook[[64, 128]] = codebook[1].clone()  # duplicates at tile starts
    z = torch.cat([codebook[[5, 70, 999, 1, 128]], torch.randint(-3, 4, (40, 16)).float()])
    ref = vq_nearest_ref(z, codebook)
    assert ref[:5].tolist() == [5, 5, 5, 1, 1]
    got = kernels.vq_nearest(z.to(device), codebook.to(device), impl=impl).cpu()
    assert torch.equal(got, ref)
    constant = torch.ones(300, 8)  # every code equidistant: index 0
    assert kernels.vq_nearest(z[:, :8].to(device), constant.to(device), impl=impl).eq(0).all()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_return_quantized(impl, dtype):
    device = impl_device(impl)
    z = torch.randn(50, 24).to(dtype).to(device)
    codebook = torch.randn(37, 24).to(dtype).to(device)
    indices, quantized = kernels.vq_nearest(z, codebook, return_quantized=True, impl=impl)
    assert quantized.dtype == dtype and quantized.shape == z.shape
    assert torch.equal(quantized, codebook[indices])


@pytest.mark.parametrize("impl", IMPLS)
def test_empty_input_and_bad_shapes(impl):
    device = impl_device(impl)
    codebook = torch.randn(10, 4, device=device)
    assert kernels.vq_nearest(torch.randn(0, 4, device=device), codebook, impl=impl).shape == (0,)
    with pytest.raises(ValueError, match="codebook"):
        kernels.vq_nearest(torch.randn(3, 5, device=device), codebook, impl=impl)
    with pytest.raises(ValueError, match="empty"):
        kernels.vq_nearest(torch.randn(3, 4, device=device), codebook[:0], impl=impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_codebook_with_grad_gives_plain_indices(impl):
    # The VQGAN passes its embedding weight (requires_grad) straight in; indices carry no graph.
    device = impl_device(impl)
    codebook = torch.randn(20, 8, device=device, requires_grad=True)
    z = torch.randn(6, 8, device=device)
    indices = kernels.vq_nearest(z, codebook, impl=impl)
    assert not indices.requires_grad
    assert torch.equal(indices, vq_nearest_ref(z, codebook.detach()))


@pytest.mark.skipif(_ext.load_error() is not None, reason=f"the compiled ops are not loaded ({_ext.load_error()})")
def test_cpp_portable_scan_matches():
    # The C++ op picks an AVX2 scan at run time; PROCAP_DISABLE_AVX2=1 exercises the portable one (fresh process).
    code = (
        "import torch\n"
        "from procap import kernels\n"
        "from procap.kernels.vq import vq_nearest_ref\n"
        "torch.manual_seed(0)\n"
        "book = torch.randint(-3, 4, (1003, 16)).float(); book[[70, 999]] = book[5].clone()\n"
        "z = torch.cat([book[[70, 999, 5]], torch.randint(-3, 4, (200, 16)).float()])\n"
        "print(torch.equal(kernels.vq_nearest(z, book, impl='cpp'), vq_nearest_ref(z, book)))\n"
    )
    env = {**os.environ, "PROCAP_DISABLE_AVX2": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
