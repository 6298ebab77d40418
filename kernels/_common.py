"""Private helpers shared by the fused ops' Triton kernels and launchers (one definition each).

- :func:`as_stored` / :func:`round_to_bf16_rne`: an fp32 value rounded to a tensor's storage dtype and back, as a
  separate eager op would leave it (the interpreter's bf16 cast truncates where GPUs round, so bf16 is rounded by
  hand);
- :func:`memory_layout` / :func:`row_strides`: how a launcher walks a dense (B, C, H, W) tensor as (B, H*W, C).
"""

from __future__ import annotations

import torch

from procap.kernels.dispatch import tl, triton_jit


@triton_jit
def round_to_bf16_rne(x):
    """Round fp32 to the nearest bf16 (ties to even), kept in fp32.

    For the interpreter, whose fp32 -> bf16 cast truncates; on GPUs the cast itself rounds to nearest even. After
    this the truncating cast is exact, so interpreted and compiled kernels store the same bits.
    """
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton_jit
def as_stored(x, like_ptr, ROUND_BF16: tl.constexpr):
    """fp32 ``x`` rounded to the storage dtype of ``like_ptr`` and back, as a separate eager add would leave it."""
    if ROUND_BF16:
        x = round_to_bf16_rne(x)
    return x.to(like_ptr.dtype.element_ty).to(tl.float32)


def memory_layout(x: torch.Tensor) -> torch.memory_format:
    """The memory format the launch uses for x: channels-last unless x is already contiguous NCHW."""
    if x.is_contiguous(memory_format=torch.channels_last) or not x.is_contiguous():
        return torch.channels_last
    return torch.contiguous_format


def row_strides(x: torch.Tensor) -> tuple[int, int, int]:
    """(sample, row, channel) strides of a dense (B, C, H, W) tensor viewed as (B, H*W, C)."""
    return x.stride(0), x.stride(3), x.stride(1)
