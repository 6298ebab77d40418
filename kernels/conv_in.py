"""The VQGAN encoder's ``conv_in`` and its first GroupNorm, with the norm's statistics written by the convolution.

The fused encoder (``procap.model.vqgan_fused``) runs ``conv_in`` (3 -> 128 channels, 3x3, stride 1, padding 1) as a
cuDNN convolution and hands its bias to the first residual block's ``norm1``, whose statistics pass then reads the
128-channel output once more and writes it back with the bias added (the block's shortcut). On the H100 profile the
convolution took 0.86 ms per batch-32 call at 1.0 TB/s (a CUTLASS sm80 kernel, write-bound), and the statistics pass
moves twice its output again (docs/gpu.md, "Prepared for issue 51"). Here one kernel does both:

- ``_conv_in_stats_kernel``, grid (B, chunks, channel tiles): a direct 3x3 convolution of a (64 rows x 32 channels)
  output tile as ``tl.dot`` s of the tile's im2col patches with the weights, 32 of the 9 * C_in columns a dot (one
  for 3 channels, three for 8), plus the bias; the tile is stored, and its running per-channel sums feed the first
  norm's partial statistics of the chunk, written in the layout of the GroupNorm statistics pass
  (``procap.kernels.groupnorm._store_partials``);
- :func:`procap.kernels.groupnorm.group_norm_from_partial_stats` then finalises and applies the norm: the statistics
  pass is skipped.

The input is read with its own strides and channel count (3, or the 8 of the padded cuDNN input), so no padded copy
of the images is made. All arithmetic is fp32 (inputs widened as loaded; for fp16 / bf16 the GPU dot runs in tf32,
which holds their products exactly); the convolution's output is rounded to the storage dtype and the bias added
and rounded again, as the bias-free convolution and the eager add of the reference are. So ``s`` differs from the
reference's only where a different fp32 summation order crosses a rounding boundary.

Contract: :func:`conv_in_norm_ref` (``F.conv2d`` without the bias, then :func:`procap.kernels.groupnorm.group_norm_ref`
adding it as ``in_bias`` and returning the sum) returns ``(y, s)``: ``s = conv(x) + bias`` and ``y = act(norm(s))``.
Forward only (the frozen tokenizer's inference): with an input that requires grad the dispatch runs the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from procap.kernels._common import as_stored, memory_layout
from procap.kernels.dispatch import (
    INTERPRETED,
    FusedOp,
    register,
    require_triton_tensor,
    run,
    tl,
    triton,
    triton_constexpr,
    triton_jit,
)
from procap.kernels.groupnorm import (
    _channel_block,
    _chunks,
    _shifted_sums,
    _store_partials,
    _tile,
    group_norm_from_partial_stats,
    group_norm_ref,
)

# The tile: 64 output pixels x 32 channels over 8 warps. Compiled for sm_90, the fp16 / bf16 kernel on the images' 3
# channels takes 120 registers a thread under Triton 3.9 and 109 under 3.6 (the GPU image's), so two blocks share
# an SM under both; 64 channels took 126 / 145 (one block under 3.6), 128 channels 242. The 128 channels of conv_in
# are four tiles, each gathering the small input again from cache. Untuned: no GPU has run it (docs/gpu.md,
# "Prepared for issue 51").
BLOCK_HW = 64
BLOCK_C = 32
NUM_WARPS = 8
# im2col columns per dot: the 9 x 3 of the images' own channels take one dot, the 9 x 8 of the padded input three
TAPS_PER_DOT = triton_constexpr(32)
MAX_IN_CHANNELS = 16
# Chunks per sample sized as the statistics pass sizes its own (8 programs per SM): the grid fills the GPU at batch
# 1 (131 chunks of a 224 px image, 1,048 programs for a pair), and the finalize merges fewer chunks than after that
# pass (5 instead of 17 at batch 32).
PROGRAMS_PER_SM = 8


def conv_in_norm_ref(
    images: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    norm_bias: torch.Tensor,
    num_groups: int,
    eps: float = 1e-6,
    silu: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: ``s = conv2d(images, conv_weight, padding=1) + conv_bias``, ``y = act(group_norm(s))``.

    Args:
        images: (B, C_in, H, W); conv_weight: (C, C_in, 3, 3) in the images' dtype; conv_bias: (C,).
        norm_weight, norm_bias, num_groups, eps, silu: the first norm's, as :func:`group_norm_ref` takes them.

    Returns:
        ``(y, s)``, both (B, C, H, W) in the images' dtype.
    """
    h = F.conv2d(images, conv_weight, None, 1, 1)
    y, s = group_norm_ref(h, norm_weight, norm_bias, num_groups, eps, silu, None, conv_bias, True)
    return y, s


@triton_jit
def _conv_weights(W_ptr, taps, cols, col_ok, C_IN: tl.constexpr):
    """Rows ``taps`` of the fp32 weight matrix: ``W[c, i, dy, dx]`` at row ``k = (3 dy + dx) * C_IN + i``, column
    ``c`` (zero rows past 9 * C_IN; W contiguous (C, C_IN, 3, 3))."""
    offs = cols[None, :] * (9 * C_IN) + (taps % C_IN * 9 + taps // C_IN)[:, None]
    ok = (taps < 9 * C_IN)[:, None] & col_ok[None, :]
    return tl.load(W_ptr + offs, mask=ok, other=0.0).to(tl.float32)


@triton_jit
def _strides(channels, hw, CHANNELS_LAST: tl.constexpr):
    """(pixel, channel) element strides of a dense (B, channels, H, W) tensor in the launch's layout."""
    pixel, channel = 1, hw
    if CHANNELS_LAST:
        pixel, channel = channels, 1
    return pixel, channel


@triton_jit
def _patches(image, rows, row_stop, taps, height, width, C_IN: tl.constexpr, CHANNELS_LAST: tl.constexpr):
    """(rows, taps) fp32 im2col of one image: output pixel r's input neighbourhood, column ``k = (3 dy + dx) * C_IN +
    i``; zero outside the image (padding 1), past 9 * C_IN and for rows at or past ``row_stop``."""
    tap = taps // C_IN
    y = (rows // width)[:, None] + (tap // 3 - 1)[None, :]
    x = (rows % width)[:, None] + (tap % 3 - 1)[None, :]
    ok = (rows < row_stop)[:, None] & (taps < 9 * C_IN)[None, :] & (y >= 0) & (y < height) & (x >= 0) & (x < width)
    pixel, channel = _strides(C_IN, height * width, CHANNELS_LAST)
    offs = (y * width + x).to(tl.int64) * pixel + (taps % C_IN * channel)[None, :]
    return tl.load(image + offs, mask=ok, other=0.0).to(tl.float32)


@triton_jit
def _convolution(
    image,
    rows,
    row_stop,
    W_ptr,
    cols,
    col_ok,
    height,
    width,
    C_IN: tl.constexpr,
    CHANNELS_LAST: tl.constexpr,
    BLOCK_HW: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """The fp32 bias-free convolution at ``rows`` x ``cols`` (zero at rows past ``row_stop``): one dot per
    ``TAPS_PER_DOT`` im2col columns, the weights read from cache each time rather than held in registers. The dot
    runs in tf32 for fp16 / bf16 images (which tf32 holds exactly: only the summation order differs from fp32)."""
    precision: tl.constexpr = "ieee" if image.dtype.element_ty == tl.float32 else "tf32"
    acc = tl.zeros((BLOCK_HW, BLOCK_C), dtype=tl.float32)
    for k0 in tl.static_range(0, 9 * C_IN, TAPS_PER_DOT):
        taps = k0 + tl.arange(0, TAPS_PER_DOT)
        patches = _patches(image, rows, row_stop, taps, height, width, C_IN, CHANNELS_LAST)
        weights = _conv_weights(W_ptr, taps, cols, col_ok, C_IN)
        acc = tl.dot(patches, weights, acc, input_precision=precision)
    return acc


@triton_jit
def _as_output(conv, bias, S_ptr, ROUND_BF16: tl.constexpr):
    """fp32 ``conv + bias`` as the reference leaves it: the bias-free convolution rounded to the storage dtype, then
    the bias added and rounded again."""
    return as_stored(as_stored(conv, S_ptr, ROUND_BF16) + bias, S_ptr, ROUND_BF16)


@triton_jit
def _conv_in_stats_kernel(
    X_ptr,
    W_ptr,
    Bias_ptr,
    S_ptr,
    Mean_ptr,
    M2_ptr,
    height,
    width,
    C,
    rows_per_chunk,
    C_IN: tl.constexpr,
    CHANNELS_LAST: tl.constexpr,
    ROUND_BF16: tl.constexpr,
    BLOCK_HW: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """``s = conv3x3(x) + bias`` on rows [chunk * rows_per_chunk, ...) of one sample, and the chunk's per-channel
    (mean, M2) of s as the GroupNorm statistics pass computes them (``shift``: the chunk's first pixel's output)."""
    pid_b, chunk = tl.program_id(0), tl.program_id(1)
    cols, col_ok = _channel_block(C, BLOCK_C)
    bias = tl.load(Bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    hw = height * width
    start = chunk * rows_per_chunk
    stop = tl.minimum(start + rows_per_chunk, hw)
    image = X_ptr + pid_b.to(tl.int64) * C_IN * hw
    conv = (W_ptr, cols, col_ok, height, width)  # then the constexprs C_IN, CHANNELS_LAST
    first = _convolution(image, start + tl.arange(0, 16), start + 1, *conv, C_IN, CHANNELS_LAST, 16, BLOCK_C)
    shift = _as_output(tl.sum(first, axis=0), bias, S_ptr, ROUND_BF16)  # the first pixel's: the other rows are 0
    acc, acc_sq = tl.zeros((BLOCK_HW, BLOCK_C), dtype=tl.float32), tl.zeros((BLOCK_HW, BLOCK_C), dtype=tl.float32)
    pixel, channel = _strides(C, hw, CHANNELS_LAST)
    for r0 in range(start, stop, BLOCK_HW):
        rows = r0 + tl.arange(0, BLOCK_HW)
        h = _convolution(image, rows, stop, *conv, C_IN, CHANNELS_LAST, BLOCK_HW, BLOCK_C)
        out = _as_output(h, bias[None, :], S_ptr, ROUND_BF16)
        ok, offs = _tile(pid_b.to(tl.int64) * C * hw, rows, stop, cols, col_ok, pixel, channel)
        tl.store(S_ptr + offs, out.to(S_ptr.dtype.element_ty), mask=ok)
        acc, acc_sq = _shifted_sums(acc, acc_sq, out, shift, ok)
    n = (stop - start).to(tl.float32)
    _store_partials(Mean_ptr, M2_ptr, pid_b * tl.num_programs(1) + chunk, C, cols, col_ok, shift, acc, acc_sq, n)


def _check(images: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> None:
    if images.dim() != 4 or weight.dim() != 4 or weight.shape[1:] != (images.shape[1], 3, 3):
        raise ValueError(
            f"conv_in takes (B, C_in, H, W) images and a (C, C_in, 3, 3) weight, got {tuple(images.shape)} and "
            f"{tuple(weight.shape)}"
        )
    if images.shape[1] > MAX_IN_CHANNELS or bias.shape != (weight.shape[0],) or weight.dtype != images.dtype:
        raise ValueError(
            f"conv_in takes at most {MAX_IN_CHANNELS} input channels, a ({weight.shape[0]},) bias and the images' "
            f"dtype for the weight, got {images.shape[1]} channels, bias {tuple(bias.shape)}, weight {weight.dtype} "
            f"for {images.dtype} images"
        )
    require_triton_tensor(images, "conv_in")


def conv_in_stats(
    images: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    *,
    block_hw: int = BLOCK_HW,
    rows_per_chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Launch the convolution: ``s = conv2d(images, weight, padding=1) + bias`` and its partial statistics.

    Args:
        images: (B, C_in, H, W), C_in <= 16, channels-last or NCHW (else made channels-last); weight: (C, C_in, 3,
            3) in the images' dtype (read as contiguous NCHW: a copy otherwise); bias: (C,).
        block_hw, rows_per_chunk: tile rows (a power of two, at least 16) and rows per chunk (None: chosen as the
            statistics pass chooses them; tests force small ones).

    Returns:
        ``(s, part_mean, part_m2, rows_per_chunk)``: s (B, C, H, W) in the images' dtype and layout; fp32 (B,
        chunks, C) per-chunk channel means and M2 of s, the layout
        :func:`~procap.kernels.groupnorm.group_norm_from_partial_stats` reads.
    """
    _check(images, weight, bias)
    layout = memory_layout(images)
    images = images.contiguous(memory_format=layout)
    batch, _, height, width = images.shape
    channels = weight.shape[0]
    block_c = max(16, min(triton.next_power_of_2(channels), BLOCK_C))  # tl.dot needs 16 at least
    c_tiles = triton.cdiv(channels, block_c)
    rows, n_chunks = _chunks(batch, height * width, c_tiles, block_hw, images.device, rows_per_chunk, PROGRAMS_PER_SM)
    s = torch.empty(batch, channels, height, width, dtype=images.dtype, device=images.device, memory_format=layout)
    part_mean, part_m2 = (images.new_empty(batch, n_chunks, channels, dtype=torch.float32) for _ in range(2))
    _launch(images, weight, bias, s, (part_mean, part_m2), rows, (block_hw, block_c), layout == torch.channels_last)
    return s, part_mean, part_m2, rows


def _launch(
    images: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    s: torch.Tensor,
    parts: tuple[torch.Tensor, torch.Tensor],
    rows_per_chunk: int,
    block: tuple[int, int],
    channels_last: bool,
) -> None:
    """The kernel over (samples, chunks, channel tiles), writing ``s`` and the partial statistics ``parts``; ``block``:
    its tile's rows and channels; ``channels_last``: the layout of both the images and ``s``."""
    batch, c_in, height, width = images.shape
    block_hw, block_c = block
    _conv_in_stats_kernel[(batch, parts[0].shape[1], triton.cdiv(s.shape[1], block_c))](
        images,
        weight.contiguous(),
        bias.to(images.dtype).contiguous(),  # rounded like the reference's eager add
        s,
        *parts,
        height,
        width,
        s.shape[1],
        rows_per_chunk,
        C_IN=c_in,
        CHANNELS_LAST=channels_last,
        ROUND_BF16=INTERPRETED and images.dtype == torch.bfloat16,
        BLOCK_HW=block_hw,
        BLOCK_C=block_c,
        num_warps=4 if INTERPRETED else NUM_WARPS,
    )


def conv_in_norm_triton(
    images: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    norm_bias: torch.Tensor,
    num_groups: int,
    eps: float = 1e-6,
    silu: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`conv_in_norm_ref`: the convolution with the statistics, then finalize and apply."""
    s, part_mean, part_m2, rows_per_chunk = conv_in_stats(images, conv_weight, conv_bias)
    y = group_norm_from_partial_stats(
        s, part_mean, part_m2, rows_per_chunk, norm_weight, norm_bias, num_groups, eps, silu
    )
    return y, s


# ----------------------------------------------------------------------------------------------- dispatch
CONV_IN_NORM = register(FusedOp("conv_in_norm", conv_in_norm_ref, conv_in_norm_triton, differentiable=False))


def conv_in_norm(
    images: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    norm_bias: torch.Tensor,
    num_groups: int,
    eps: float = 1e-6,
    silu: bool = True,
    impl: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``conv_in`` (3x3, padding 1, with its bias) and the first norm: ``(act(norm(s)), s)`` with ``s = conv(x) + b``.

    On CUDA one Triton convolution that also writes the norm's statistics, then the norm's finalize and apply;
    elsewhere, under ``torch.compile`` and whenever an input requires grad, :func:`conv_in_norm_ref`.

    Args:
        images: (B, C_in, H, W); conv_weight: (C, C_in, 3, 3); conv_bias: (C,).
        norm_weight, norm_bias: (C,); num_groups: G dividing C; eps: added to the variance; silu: taming's swish.
        impl: None (automatic) or ``"reference"`` / ``"triton"``.
    """
    if torch.compiler.is_compiling():
        return conv_in_norm_ref(images, conv_weight, conv_bias, norm_weight, norm_bias, num_groups, eps, silu)
    tensors = (images, conv_weight, conv_bias, norm_weight, norm_bias)
    requires_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    return run("conv_in_norm", impl, images, requires_grad, *tensors, num_groups, eps, silu)
