"""The procedure encoder's inference forms (``use_fused``) against its readable stack: residual add +
LayerNorm in one kernel (every dtype, the Triton kernel interpreted on CPU), and the MLP's GELU in the GEMM epilogue:
cuBLASLt's (exact on the CPU; tanh-approximated on CUDA, checked there and its effect measured here) and the erf one of
a Triton GEMM (every dtype, interpreted on CPU)."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from procap import kernels
from procap.core.errors import ProCapError
from procap.model.encoder import ProcedureEncoder
from tests.support import DTYPES, impl_device, max_abs_err, requires_cuda, small_config

pytestmark = pytest.mark.usefixtures("fresh_dispatch")


def _encoder(dtype=torch.float32, **overrides) -> ProcedureEncoder:
    torch.manual_seed(0)
    config = small_config(enc_layers=2, enc_dim=64, enc_heads=2, enc_mlp=128, **overrides)
    encoder = ProcedureEncoder(config).eval()
    for p in encoder.parameters():  # non-trivial affine parameters and biases
        p.data.add_(torch.randn_like(p) * 0.1)
    return encoder.to(dtype)


def _tokens(dtype=torch.float32) -> torch.Tensor:
    return (torch.randn(2, 9, 64, generator=torch.Generator().manual_seed(1)) * 2).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_add_norm_stack_with_the_kernel_matches_the_readable_stack(dtype, monkeypatch):
    device = impl_device("triton")  # compiled on a GPU, interpreted on the CPU
    encoder, x = _encoder(dtype).to(device), _tokens(dtype).to(device)
    with torch.no_grad():
        readable = encoder(x)
        truth = _encoder(torch.float64).to(device)(x.double())
        encoder.use_fused()
        monkeypatch.setenv("PROCAP_KERNELS", "triton")
        kernels.reset_dispatch()
        kept = x.clone()
        fused = encoder(x)
    assert kernels.chosen_impl("add_layer_norm", x.device, dtype) == "triton"
    assert torch.equal(x, kept)  # the input is never written
    assert fused.dtype == dtype and fused.shape == x.shape
    # The kernel normalises in fp32 from the rounded sum: at most about the readable stack's own error.
    assert max_abs_err(fused, truth) <= 2 * max_abs_err(readable, truth) + 1e-5
    if dtype == torch.float32:
        torch.testing.assert_close(fused, readable, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("final_norm", [True, False], ids=["final-norm", "no-final-norm"])
def test_add_norm_stack_with_the_reference_op_is_the_readable_stack(final_norm):
    # On the CPU the dispatch runs add_layer_norm's reference (an in-place add, F.layer_norm): the same bits as the
    # readable stack, the add's operands swapped (exact in IEEE arithmetic); also with CLIP-style blocks.
    overrides = {} if final_norm else {"authors": {"final_norm": False}, "enc_activation": "quick_gelu"}
    encoder, x = _encoder(**overrides), _tokens()
    with torch.no_grad():
        readable = encoder(x)
        encoder.use_fused()
        assert torch.equal(encoder(x), readable)
    out = encoder(x.requires_grad_())  # with gradients the readable stack runs, and they flow
    out.sum().backward()
    assert x.grad is not None and torch.equal(out.detach(), readable)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gelu_epilogue_on_the_cpu_is_the_models_erf_gelu(dtype):
    encoder, x = _encoder(dtype), _tokens(dtype)
    with torch.no_grad():
        readable = encoder(x)
        encoder.use_fused(add_norm=False, gelu_epilogue=True)
        fused = encoder(x)
    assert all(layer.mlp.gelu_epilogue for layer in encoder.layers)
    torch.testing.assert_close(fused, readable, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gelu_erf_epilogue_keeps_the_models_function(dtype, monkeypatch):
    # The erf GELU in a Triton GEMM's epilogue (kernels.linear_gelu, interpreted here): the readable stack's output
    # within its own rounding (the GEMM's summation order is the only difference), with and without add_norm.
    device = impl_device("triton")
    encoder, x = _encoder(dtype).to(device), _tokens(dtype).to(device)
    calls = []
    real = kernels.linear_gelu
    monkeypatch.setattr(kernels, "linear_gelu", lambda *args: calls.append(args[0].shape) or real(*args))
    monkeypatch.setenv("PROCAP_KERNELS", "triton")
    kernels.reset_dispatch()
    with torch.no_grad():
        readable = encoder(x)
        truth = _encoder(torch.float64).to(device)(x.double())
        for add_norm in (False, True):
            encoder.use_fused(add_norm=add_norm, gelu_erf_epilogue=True)
            fused = encoder(x)
            assert fused.dtype == dtype and fused.shape == x.shape
            assert max_abs_err(fused, truth) <= 2 * max_abs_err(readable, truth) + 1e-5
            if dtype == torch.float32:
                torch.testing.assert_close(fused, readable, rtol=1e-5, atol=1e-5)
    assert calls == [(18, 64)] * 4  # every layer's fc1, both forms
    assert all(layer.mlp.gelu_erf_epilogue and not layer.mlp.gelu_epilogue for layer in encoder.layers)


def test_gelu_erf_epilogue_through_the_reference_is_the_readable_stack():
    # On the CPU the dispatch runs linear_gelu's reference, F.gelu(F.linear(...)): the readable MLP's ops, the same
    # bits; with gradients the readable stack runs.
    encoder, x = _encoder(), _tokens()
    with torch.no_grad():
        readable = encoder(x)
        encoder.use_fused(add_norm=False, gelu_erf_epilogue=True)
        assert kernels.chosen_impl("linear_gelu", x.device, x.dtype) == "reference"
        assert torch.equal(encoder(x), readable)
    out = encoder(x.requires_grad_())
    out.sum().backward()
    assert x.grad is not None and torch.equal(out.detach(), readable)


def test_one_gelu_epilogue_at_a_time():
    encoder = _encoder()
    with pytest.raises(ProCapError, match="one GELU epilogue: gelu_epilogue or gelu_erf_epilogue"):
        encoder.use_fused(gelu_epilogue=True, gelu_erf_epilogue=True)
    assert not encoder.fused


def test_tanh_gelu_flavour_error_is_small_but_not_zero():
    # What CUDA's epilogue computes instead of the model's erf GELU, emulated on the CPU: the gate a GPU run applies
    # (memory and token agreement) must judge it; here its size at the encoder output in fp32.
    encoder, x = _encoder(), _tokens()
    with torch.no_grad():
        erf = encoder(x)
        for layer in encoder.layers:
            layer.mlp.activation = functools.partial(F.gelu, approximate="tanh")
        tanh = encoder(x)
    relative = ((tanh - erf).norm() / erf.norm()).item()
    assert 0 < relative < 1e-3, relative


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cuda_gelu_epilogue_is_tanh_approximated(dtype):
    torch.manual_seed(0)
    x, w, b = (torch.randn(shape, device="cuda", dtype=dtype) for shape in ((256, 64), (128, 64), (128,)))
    got = torch._addmm_activation(b, x, w.t(), use_gelu=True)
    tanh = F.gelu(F.linear(x.double(), w.double(), b.double()), approximate="tanh")
    erf = F.gelu(F.linear(x.double(), w.double(), b.double()))
    if dtype == torch.float32:  # the flavour shows in fp32; in bf16 the output's rounding (up to 0.06 here) hides
        # the flavours' gap (under 5e-4), and on the H100 the share of outputs equal to each rounded flavour did not
        # favour tanh either (cuBLASLt's bf16 epilogue need not round as an fp32 GELU would): there only the size
        assert max_abs_err(got, tanh) < max_abs_err(got, erf)
        assert max_abs_err(got, tanh) < 1e-3
    else:  # two roundings of the largest output at most (the H100 measured one ulp, 0.0625 at values near 12)
        assert max_abs_err(got, tanh) <= 2 * torch.finfo(dtype).eps * tanh.abs().max().item()
