"""Fused GroupNorm (+ SiLU, + residual) against ``group_norm_ref``: outputs, gradients, layouts, numerics, the VQGAN."""

from __future__ import annotations

import warnings

import pytest
import torch

from procap import kernels
from procap.core.config import get_preset
from procap.kernels.groupnorm import group_norm_fwd, group_norm_ref
from procap.model.vqgan import VQGAN
from tests.support import DTYPES, impl_device, max_abs_err

IMPLS = ["reference", "triton"]
# (B, C, H, W), groups: odd spatial sizes, 3 channels per group (not a power of two), one channel per group, H*W = 1.
SHAPES = [((2, 64, 7, 9), 32), ((1, 96, 5, 13), 32), ((3, 32, 3, 3), 32), ((2, 128, 1, 1), 32), ((1, 24, 4, 6), 4)]

pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning"),  # the interpreter's sigmoid
    pytest.mark.usefixtures("fresh_dispatch"),
]


def _inputs(shape, dtype, device, channels_last=True, residual=False, requires_grad=False, offset=5.0):
    x = (torch.randn(shape, device=device) * 3 + offset).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    r = torch.randn(shape, device=device).to(dtype) if residual else None
    weight, bias = torch.randn(shape[1], device=device), torch.randn(shape[1], device=device)
    for t in (x, r, weight, bias):
        if t is not None:
            t.requires_grad_(requires_grad)
    return x, r, weight, bias


def _outputs(out) -> list[torch.Tensor]:
    return list(out) if isinstance(out, tuple) else [out]


def _truth(x, r, weight, bias, groups, silu, in_bias=None):
    """fp64 ground truth and its leaves (x, weight, bias, then the residual and the in_bias when given)."""
    given = [t for t in (x, weight, bias, r, in_bias) if t is not None]
    leaves = [t.detach().double().requires_grad_(True) for t in given]
    x64, w64, b64 = leaves[:3]
    rest = iter(leaves[3:])
    r64 = next(rest) if r is not None else None
    ib64 = next(rest) if in_bias is not None else None
    out = group_norm_ref(x64, w64, b64, groups, 1e-6, silu, r64, ib64, return_sum=in_bias is not None)
    return _outputs(out), leaves


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,groups", SHAPES, ids=str)
@pytest.mark.parametrize("silu", [True, False], ids=["silu", "plain"])
@pytest.mark.parametrize("residual", [False, True], ids=["x", "x+r"])
def test_forward_matches_reference(impl, dtype, shape, groups, silu, residual):
    x, r, weight, bias = _inputs(shape, dtype, impl_device(impl), residual=residual)
    got = _outputs(kernels.group_norm(x, weight, bias, groups, 1e-6, silu, r, impl=impl))
    ref = _outputs(group_norm_ref(x, weight, bias, groups, 1e-6, silu, r))
    truth, _ = _truth(x, r, weight, bias, groups, silu)
    for g, f, t in zip(got, ref, truth):
        assert g.dtype == dtype and g.shape == x.shape
        assert g.is_contiguous(memory_format=torch.channels_last)
        # One rounding at the end instead of the eager op-by-op rounding: at most ~2x the reference's own error.
        assert max_abs_err(g, t) <= 2 * max_abs_err(f, t) + 2e-5
    if residual:
        assert torch.equal(got[1], ref[1])  # the sum is one add, rounded like torch's


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("silu", [True, False], ids=["silu", "plain"])
@pytest.mark.parametrize("residual,use_sum", [(False, False), (True, False), (True, True)], ids=["x", "x+r", "x+r,sum"])
def test_gradients_match_reference(dtype, silu, residual, use_sum):
    shape, groups = (2, 96, 5, 7), 32
    x, r, weight, bias = _inputs(shape, dtype, impl_device("triton"), residual=residual, requires_grad=True)
    leaves = [x, weight, bias] + ([r] if residual else [])
    got = _outputs(kernels.group_norm(x, weight, bias, groups, 1e-6, silu, r, impl="triton"))
    ref = _outputs(group_norm_ref(x, weight, bias, groups, 1e-6, silu, r))
    truth, leaves64 = _truth(x, r, weight, bias, groups, silu)
    n_out = 2 if use_sum else 1
    grads_out = [torch.randn(shape, device=x.device) for _ in range(n_out)]
    g_got = torch.autograd.grad([o.float() for o in got[:n_out]], leaves, grads_out)
    g_ref = torch.autograd.grad([o.float() for o in ref[:n_out]], leaves, grads_out)
    g_true = torch.autograd.grad(truth[:n_out], leaves64, [g.double() for g in grads_out])
    for name, a, b, t in zip(["x", "weight", "bias", "residual"], g_got, g_ref, g_true):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert max_abs_err(a, t) <= 2 * max_abs_err(b, t) + 1e-5, name


@pytest.mark.parametrize("channels_last", [True, False], ids=["nhwc", "nchw"])
def test_layouts_are_kept(channels_last):
    x, _, weight, bias = _inputs((2, 64, 6, 5), torch.float32, impl_device("triton"), channels_last=channels_last)
    y = kernels.group_norm(x, weight, bias, 32, silu=True, impl="triton")
    assert y.stride() == x.stride()
    torch.testing.assert_close(y, group_norm_ref(x, weight, bias, 32, silu=True), rtol=1e-5, atol=1e-5)
    strided = x[:, :, ::2]  # neither layout: the launcher makes it channels-last
    torch.testing.assert_close(
        kernels.group_norm(strided, weight, bias, 32, impl="triton"),
        group_norm_ref(strided, weight, bias, 32),
        rtol=1e-5,
        atol=1e-5,
    )


def test_many_tiles_and_chunks_with_a_large_mean():
    # Small tiles and chunks exercise both merges (lanes in a chunk, chunks in the finalize kernel). A mean 1e4 times
    # the spread loses every digit in E[x^2] - E[x]^2 in fp32; the Chan merges and the kernel's per-chunk shift keep
    # the variance. (torch 2.13's own CPU group_norm in fp32 was off by 66 here, so
    # the fp64 reference is the yardstick.)
    shape = (2, 64, 13, 11)
    device = impl_device("triton")
    x = (torch.randn(shape, device=device) * 0.01 + 100.0).contiguous(memory_format=torch.channels_last)
    weight, bias = torch.randn(64, device=device), torch.randn(64, device=device)
    truth = group_norm_ref(x.double(), weight.double(), bias.double(), 32, 1e-6, True)
    for block_hw, rows_per_chunk in [(16, 16), (16, 48), (32, 200)]:
        y = group_norm_fwd(x, weight, bias, 32, 1e-6, True, block_hw=block_hw, rows_per_chunk=rows_per_chunk)[0]
        assert max_abs_err(y, truth) < 5e-3, (block_hw, rows_per_chunk)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("silu", [True, False], ids=["silu", "plain"])
@pytest.mark.parametrize(
    "residual,return_sum", [(False, False), (False, True), (True, False)], ids=["x+b", "x+b,sum", "x+b+r"]
)
def test_in_bias_matches_reference(dtype, silu, residual, return_sum):
    # The bias of a convolution run without it, added where the norm reads x: the same outputs as the reference
    # normalising (x + b) (+ r); the sum, when written, rounded exactly like the reference's two eager adds.
    shape, groups = (2, 64, 7, 9), 32
    x, r, weight, bias = _inputs(shape, dtype, impl_device("triton"), residual=residual)
    in_bias = torch.randn(shape[1], device=x.device) * 4
    got = _outputs(
        kernels.group_norm(x, weight, bias, groups, 1e-6, silu, r, "triton", in_bias=in_bias, return_sum=return_sum)
    )
    ref = _outputs(group_norm_ref(x, weight, bias, groups, 1e-6, silu, r, in_bias, return_sum))
    truth, _ = _truth(x, r, weight, bias, groups, silu, in_bias)
    assert len(got) == len(ref) == (2 if residual or return_sum else 1)
    for g, f, t in zip(got, ref, truth):
        assert g.dtype == dtype and g.is_contiguous(memory_format=torch.channels_last)
        assert max_abs_err(g, t) <= 2 * max_abs_err(f, t) + 2e-5
    if dtype == torch.float32:
        torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-5)
    if len(got) == 2:
        assert torch.equal(got[1], ref[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("residual", [False, True], ids=["x+b", "x+b+r"])
def test_in_bias_gradients_match_reference(dtype, residual):
    shape, groups = (2, 64, 5, 7), 32
    x, r, weight, bias = _inputs(shape, dtype, impl_device("triton"), residual=residual, requires_grad=True)
    in_bias = torch.randn(shape[1], device=x.device, requires_grad=True)
    leaves = [x, weight, bias] + ([r] if residual else []) + [in_bias]
    got = _outputs(kernels.group_norm(x, weight, bias, groups, 1e-6, True, r, "triton", in_bias=in_bias))
    ref = _outputs(group_norm_ref(x, weight, bias, groups, 1e-6, True, r, in_bias))
    truth, leaves64 = _truth(x, r, weight, bias, groups, True, in_bias)
    grads_out = [torch.randn(shape, device=x.device) for _ in got]
    g_got = torch.autograd.grad([o.float() for o in got], leaves, grads_out)
    g_ref = torch.autograd.grad([o.float() for o in ref], leaves, grads_out)
    g_true = torch.autograd.grad(truth[: len(got)], leaves64, [g.double() for g in grads_out])
    names = ["x", "weight", "bias"] + (["residual"] if residual else []) + ["in_bias"]
    for name, a, b, t in zip(names, g_got, g_ref, g_true):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        # Up to 2x the reference's own error, plus one rounding of the largest value in the storage dtype.
        ulp = torch.finfo(a.dtype).eps * t.abs().max().item()
        assert max_abs_err(a, t) <= 2 * max_abs_err(b, t) + ulp + 1e-5, name


def test_bad_inputs_raise():
    x, r, weight, bias = _inputs((2, 64, 3, 3), torch.float32, impl_device("triton"), residual=True)
    with pytest.raises(ValueError, match="do not fit"):
        kernels.group_norm(x, weight, bias, 24, impl="triton")
    with pytest.raises(ValueError, match="residual"):
        kernels.group_norm(x, weight, bias, 32, residual=r[:1], impl="triton")
    with pytest.raises(ValueError, match="no compiled"):
        kernels.group_norm(x.cpu(), weight.cpu(), bias.cpu(), 32, impl="cpp")


def test_cpu_dispatch_is_the_reference_without_warning():
    x, _, weight, bias = _inputs((2, 64, 3, 3), torch.float32, "cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = kernels.group_norm(x, weight, bias, 32, silu=True)
    assert kernels.chosen_impl("group_norm", "cpu", torch.float32) == "reference"
    assert kernels.chosen_impl("group_norm", "cuda", torch.bfloat16, True) == "triton"
    assert torch.equal(y, group_norm_ref(x, weight, bias, 32, silu=True))


def test_vqgan_with_the_fused_kernels_matches_the_reference(monkeypatch):
    # The tiny VQGAN end to end (encoder: norm + swish, attention norm; decoder: chained blocks, so the residual
    # variant) and its parameter gradients, Triton (interpreted) vs the reference.
    # The quantizer is left out: a near-tie could pick another code and hide what is compared.
    torch.manual_seed(0)
    device = impl_device("triton")
    model = VQGAN(get_preset("tiny").vqgan).train().to(device)
    images, latents = torch.rand(1, 3, 64, 64, device=device), torch.randn(1, 64, 8, 8, device=device)

    def run() -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        loss = model.encoder(images).square().mean() + model.decoder(latents).square().mean()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    ref_loss, ref_grads = run()
    monkeypatch.setenv("PROCAP_KERNELS", "triton")
    kernels.reset_dispatch()
    loss, grads = run()
    assert kernels.chosen_impl("group_norm", device.type, torch.float32, True) == "triton"
    torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-5)
    assert len(grads) == len(ref_grads)
    for got, ref in zip(grads, ref_grads):
        torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-4)
