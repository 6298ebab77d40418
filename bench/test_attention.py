"""Attention backends x shapes: the (k+2)*196-token procedure-encoder sequence and the decoder's cross-attention.

Run: ``pytest bench/test_attention.py --benchmark-only``. On a CPU-only machine the CPU shapes run (the
``tiny`` preset's (2+2)*64 = 256-token sequence) so CI exercises the suite; GPU shapes are skipped there.
"""

from __future__ import annotations

import pytest
import torch
from conftest import device_info, synchronize

from procap.kernels.attention import BACKENDS, attention, unavailable_reason

# name -> (B, H, Lq, Lk, Dh, causal)
GPU_SHAPES = {
    "encoder_k2_b32": (32, 12, 784, 784, 64, False),  # (k+2)*196 tokens at k=2, 12 heads x 64
    "encoder_k7_b32": (32, 12, 1764, 1764, 64, False),
    "encoder_k2_b1": (1, 12, 784, 784, 64, False),
    "decoder_cross_b32": (32, 8, 1, 784, 64, False),  # one decoding query against the memory
}
CPU_SHAPES = {
    "encoder_tiny_b2": (2, 4, 256, 256, 32, False),  # tiny preset: (2+2)*64 tokens, 4 heads x 32
    "decoder_self_tiny_b2": (2, 4, 23, 23, 32, True),
}


def _flops(b: int, h: int, lq: int, lk: int, dh: int, causal: bool) -> float:
    # Two matmuls of 2*Lq*Lk*Dh each; a causal square mask skips about half.
    flops = 4.0 * b * h * lq * lk * dh
    return flops / 2 if causal and lq == lk else flops


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "auto"])
@pytest.mark.parametrize("shape_name", [*GPU_SHAPES, *CPU_SHAPES])
def test_attention_backend(benchmark, bench_device, backend, shape_name):
    on_gpu = bench_device.type == "cuda"
    if (shape_name in GPU_SHAPES) != on_gpu:
        pytest.skip(f"{shape_name} is a {'GPU' if shape_name in GPU_SHAPES else 'CPU'} shape; device is {bench_device}")
    dtype = torch.bfloat16 if on_gpu else torch.float32
    reason = unavailable_reason(backend, bench_device, dtype)
    if reason:
        pytest.skip(f"{backend}: {reason}")
    b, h, lq, lk, dh, causal = (GPU_SHAPES | CPU_SHAPES)[shape_name]
    if backend == "math" and on_gpu and lq * lk * b * h > 2**31:
        pytest.skip("the math reference would materialise > 2^31 scores")
    q = torch.randn(b, h, lq, dh, device=bench_device, dtype=dtype)
    k, v = (torch.randn(b, h, lk, dh, device=bench_device, dtype=dtype) for _ in range(2))

    def run() -> torch.Tensor:
        out = attention(q, k, v, causal=causal, backend=backend)
        synchronize(bench_device)
        return out

    run()  # warm-up: kernel selection, cuDNN plans, flash-attn JIT state stay out of the timing
    benchmark.pedantic(run, rounds=20 if on_gpu else 5, iterations=1, warmup_rounds=2)
    seconds = benchmark.stats.stats.median
    benchmark.extra_info.update(device_info(bench_device))
    benchmark.extra_info.update(
        {
            "backend": backend,
            "shape": [b, h, lq, lk, dh],
            "causal": causal,
            "dtype": str(dtype),
            "tflops": _flops(b, h, lq, lk, dh, causal) / seconds / 1e12,
        }
    )
