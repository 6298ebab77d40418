"""Fused multi-granularity masking: implementations x modes x shapes.

Run: ``pytest bench/test_masking.py --benchmark-only``. GPU shapes are the paper's (B=16, k=2 -> T=4 frames of
14 x 14 = 196 patches, 768 dims); on a CPU-only machine the CPU shapes run instead and Triton is skipped (the
interpreter is not a speed target). Reported rate: effective GB/s over the bytes each mode must move and its
fraction of the device's HBM bandwidth, from ``conftest.time_op`` (``triton.testing.do_bench`` on CUDA).
"""

from __future__ import annotations

import pytest
import torch
from conftest import bandwidth_info, device_info, time_op

from procap import kernels
from procap.core.config import MaskingConfig
from procap.model.masking import sample_mask_params

# name -> (B, T, H, W, D)
GPU_SHAPES = {"paper_k2_b16": (16, 4, 14, 14, 768), "paper_k7_b16": (16, 9, 14, 14, 768)}
CPU_SHAPES = {"cpu_k2_b4": (4, 4, 14, 14, 768), "tiny_b8": (8, 4, 8, 8, 128)}
IMPLS = ["reference", "cpp", "triton"]


def _bytes_moved(batch: int, n_pos: int, dim: int, itemsize: int, mode: str) -> int:
    # forward: read x, write out (+ uniform fp32 in, bool mask out); backward: read grad, read mask, write grad_x.
    fwd = 2 * batch * n_pos * dim * itemsize + batch * n_pos * 5
    return fwd if mode == "fwd" else fwd + 2 * batch * n_pos * dim * itemsize + batch * n_pos


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape_name", [*GPU_SHAPES, *CPU_SHAPES])
def test_masking(benchmark, bench_device, impl, mode, dtype, shape_name):
    on_gpu = bench_device.type == "cuda"
    if (shape_name in GPU_SHAPES) != on_gpu:
        pytest.skip(f"{shape_name} is a {'GPU' if shape_name in GPU_SHAPES else 'CPU'} shape; device is {bench_device}")
    if impl == "triton" and not on_gpu:
        pytest.skip("Triton on CPU only runs in the interpreter, which is not a speed target")
    if impl == "cpp" and on_gpu:
        pytest.skip("the C++ op is the CPU implementation")
    batch, frames, grid_h, grid_w, dim = (GPU_SHAPES | CPU_SHAPES)[shape_name]
    n_pos = frames * grid_h * grid_w
    try:
        kernels.chosen_impl("masking", bench_device, dtype)  # warm the dispatch cache
        params = sample_mask_params(batch, frames, grid_h, grid_w, MaskingConfig(), device=bench_device)
        x = torch.randn(batch, n_pos, dim, device=bench_device, dtype=dtype, requires_grad=mode == "fwd_bwd")
        tables = [
            torch.randn(n, dim, device=bench_device, requires_grad=mode == "fwd_bwd") for n in (frames, grid_h, grid_w)
        ]
        em = torch.randn(dim, device=bench_device, requires_grad=mode == "fwd_bwd")
        grad = torch.randn(batch, n_pos, dim, device=bench_device, dtype=dtype)
        kernels.masking(x, params, em, *tables, impl=impl)
    except ValueError as exc:
        pytest.skip(str(exc))

    def run() -> None:
        out, _ = kernels.masking(x, params, em, *tables, impl=impl)
        if mode == "fwd_bwd":
            torch.autograd.backward(out, grad, inputs=[x, em, *tables])

    seconds = time_op(benchmark, run, bench_device, rounds=20 if on_gpu else 5)
    benchmark.extra_info.update(device_info(bench_device))
    benchmark.extra_info.update(
        {"impl": impl, "mode": mode, "shape": [batch, frames, grid_h, grid_w, dim], "dtype": str(dtype)}
    )
    bytes_moved = _bytes_moved(batch, n_pos, dim, x.element_size(), mode)
    benchmark.extra_info.update(bandwidth_info(bytes_moved, seconds, bench_device))
