"""VQ codebook lookup: implementations x shapes, against ``torch.cdist + argmin`` and the reference expansion.

Run: ``pytest bench/test_vq.py --benchmark-only``. GPU shapes are the paper's (N = 16*4*196 lookups, K = 1024
codes, D = 256); on a CPU-only machine the CPU shapes run instead and Triton is skipped. Reported rate: GFLOP/s
counting the 2*N*K*D multiply-adds of the distance matrix (which the fused kernels never store), and GB/s of the
compulsory traffic, from ``conftest.time_op`` (``triton.testing.do_bench`` on CUDA).
"""

from __future__ import annotations

import pytest
import torch
from conftest import bandwidth_info, device_info, time_op

from procap import kernels

# name -> (N, K, D)
GPU_SHAPES = {"paper_b16_k2": (16 * 4 * 196, 1024, 256)}
CPU_SHAPES = {"cpu_b4_k2": (4 * 4 * 196, 1024, 256), "tiny": (2 * 4 * 64, 256, 64)}
IMPLS = ["cdist", "reference", "cpp", "triton", "cuda"]


def _cdist_argmin(z: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """The common eager baseline: Euclidean distances with torch.cdist, then argmin."""
    return torch.cdist(z.float(), codebook.float()).argmin(1)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape_name", [*GPU_SHAPES, *CPU_SHAPES])
def test_vq_nearest(benchmark, bench_device, impl, dtype, shape_name):
    on_gpu = bench_device.type == "cuda"
    if (shape_name in GPU_SHAPES) != on_gpu:
        pytest.skip(f"{shape_name} is a {'GPU' if shape_name in GPU_SHAPES else 'CPU'} shape; device is {bench_device}")
    if impl == "triton" and not on_gpu:
        pytest.skip("Triton on CPU only runs in the interpreter, which is not a speed target")
    n_rows, n_codes, dim = (GPU_SHAPES | CPU_SHAPES)[shape_name]
    z = torch.randn(n_rows, dim, device=bench_device).to(dtype)
    codebook = torch.randn(n_codes, dim, device=bench_device).to(dtype)
    if impl == "cdist":
        fn = _cdist_argmin
    else:
        try:
            kernels.vq_nearest(z[:1], codebook, impl=impl)
        except ValueError as exc:
            pytest.skip(str(exc))

        def fn(z: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
            return kernels.vq_nearest(z, codebook, impl=impl)

    seconds = time_op(benchmark, lambda: fn(z, codebook), bench_device, rounds=20 if on_gpu else 5)
    benchmark.extra_info.update(device_info(bench_device))
    benchmark.extra_info.update(
        {
            "impl": impl,
            "shape": [n_rows, n_codes, dim],
            "dtype": str(dtype),
            "gflops": 2.0 * n_rows * n_codes * dim / seconds / 1e9,
        }
    )
    # Compulsory traffic: read z and the codebook, write the int64 indices.
    bytes_moved = (n_rows * dim + n_codes * dim) * z.element_size() + n_rows * 8
    benchmark.extra_info.update(bandwidth_info(bytes_moved, seconds, bench_device))
