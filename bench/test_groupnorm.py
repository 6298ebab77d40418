"""Fused GroupNorm + SiLU (+ residual) on channels-last activations: Triton vs eager PyTorch (vs torch.compile).

Run: ``pytest bench/test_groupnorm.py --benchmark-only``. GPU shapes are the clevr VQGAN's levels for a batch of
32 pairs (64 images): 224^2 x 128 (the largest single cost), 56^2 x 256 and 14^2 x 512, in bf16, channels-last.
Providers: ``eager`` (``F.group_norm`` + ``x * sigmoid(x)``, the model before this op; PyTorch transposes channels-last
input to NCHW and back), ``triton`` (``procap.kernels.group_norm``) and, on CUDA, ``compiled`` (``torch.compile`` of
the eager code; its compile time stays out of the timing). Reported rate: GB/s over the bytes the op must move at
least (fused: read x twice and write y; with a residual read x and r, write and re-read the sum, write y) and its
fraction of the device's HBM bandwidth; every provider is rated against the same bytes. On a CPU-only machine small
shapes run the eager provider only (Triton there is the interpreter).
"""

from __future__ import annotations

import pytest
import torch
from conftest import bandwidth_info, device_info, time_op

from procap import kernels
from procap.kernels.groupnorm import group_norm_ref

# name -> (images, channels, size)
GPU_SHAPES = {"level0_b32": (64, 128, 224), "level2_b32": (64, 256, 56), "mid_b32": (64, 512, 14)}
CPU_SHAPES = {"tiny_level0_b4": (8, 32, 64), "cpu_level2_b1": (2, 256, 56)}
PROVIDERS = ["eager", "triton", "compiled"]
_compiled: dict[bool, object] = {}


def _bytes_moved(numel: int, itemsize: int, residual: bool, mode: str) -> int:
    fwd = (5 if residual else 3) * numel * itemsize
    # backward: two passes over (s, dy), write dx (+ read the sum's gradient with a residual)
    bwd = (6 if residual else 5) * numel * itemsize
    return fwd if mode == "fwd" else fwd + bwd


def _provider_fn(provider: str, residual: bool):
    if provider == "eager":
        return lambda *args: group_norm_ref(*args)
    if provider == "triton":
        return lambda *args: kernels.group_norm(*args, impl="triton")
    if residual not in _compiled:
        _compiled[residual] = torch.compile(group_norm_ref, dynamic=False)
    return _compiled[residual]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
@pytest.mark.parametrize("residual", [False, True], ids=["silu", "add_silu"])
@pytest.mark.parametrize("shape_name", [*GPU_SHAPES, *CPU_SHAPES])
def test_group_norm_silu(benchmark, bench_device, provider, mode, residual, shape_name):
    on_gpu = bench_device.type == "cuda"
    if (shape_name in GPU_SHAPES) != on_gpu:
        pytest.skip(f"{shape_name} is a {'GPU' if shape_name in GPU_SHAPES else 'CPU'} shape; device is {bench_device}")
    if provider != "eager" and not on_gpu:
        pytest.skip(f"{provider} is measured on CUDA only (Triton on CPU is the interpreter)")
    images, channels, size = (GPU_SHAPES | CPU_SHAPES)[shape_name]
    dtype = torch.bfloat16 if on_gpu else torch.float32
    grad = mode == "fwd_bwd"

    def tensor() -> torch.Tensor:
        x = torch.randn(images, channels, size, size, device=bench_device, dtype=dtype)
        return x.contiguous(memory_format=torch.channels_last).requires_grad_(grad)

    x, r = tensor(), tensor() if residual else None
    weight = torch.randn(channels, device=bench_device, dtype=dtype, requires_grad=grad)
    bias = torch.randn(channels, device=bench_device, dtype=dtype, requires_grad=grad)
    fn = _provider_fn(provider, residual)
    dy = torch.randn_like(x)

    def run() -> None:
        out = fn(x, weight, bias, 32, 1e-6, True, r)
        y = out[0] if residual else out
        if grad:
            torch.autograd.backward(y, dy)

    seconds = time_op(benchmark, run, bench_device, rounds=20 if on_gpu else 5)
    benchmark.extra_info.update(device_info(bench_device))
    benchmark.extra_info.update(
        {"provider": provider, "mode": mode, "residual": residual, "shape": [images, channels, size, size]}
    )
    benchmark.extra_info["dtype"] = str(dtype)
    benchmark.extra_info.update(
        bandwidth_info(_bytes_moved(x.numel(), x.element_size(), residual, mode), seconds, bench_device)
    )
