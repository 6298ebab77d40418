"""Fused GroupNorm (+ SiLU, + residual add, + input bias) on channels-last activations: reference, Triton, autograd.

The VQGAN (taming's f16 layout) normalises every residual-block input with ``GroupNorm(32, eps=1e-6)`` followed by
swish, ``silu(z) = z * sigmoid(z)``. Eagerly that is a GroupNorm (which PyTorch runs on NCHW, so a channels-last
tensor is transposed there and back) plus three elementwise passes for the swish. Here one op computes

    s = (x + in_bias[c]) + residual                         (both optional; s written out when asked for)
    y = act((s - mean_g) * rstd_g * weight_c + bias_c)      act = silu or identity

with the statistics of group ``g`` over all H*W positions and the group's C/G channels, in three launches:

1. ``_group_norm_stats_kernel``, grid (B, chunks, channel tiles): per-channel mean and M2 (sum of squared
   deviations) of a chunk of rows. Each lane keeps running sums of ``x - shift`` and its square in registers
   (``shift``: the chunk's first row), so the loop has no block-wide reduction and no barrier; one reduction at the
   end. (The former version, two block-wide reductions and a Chan merge per tile, was 2.5 ms slower at batch 32 on
   an H100, docs/gpu.md, and is gone.)
2. ``_group_norm_finalize_kernel``, grid (B,): merges the chunks (Chan's parallel update, no E[x^2] - E[x]^2
   cancellation), then the channels of each group, into mean and rstd per (sample, group), and writes per-(sample,
   channel) ``mean`` and ``scale = rstd * weight``.
3. ``_group_norm_apply_kernel``, grid (B, row tiles, channel tiles): ``y = act((s - mean) * scale + bias)``
   (subtracting the mean first keeps a near-constant group exact, unlike ``s * scale + (bias - mean * scale)``).

``in_bias`` is the bias of the convolution that produced x, run without it (``procap.model.vqgan_fused``): ATen
would add it in a separate, non-vectorised pass. When the sum is not needed afterwards it is never stored: the apply
kernel adds the bias again as it reads x. Each add is rounded to the storage dtype as the reference's eager add is,
so a written sum equals the reference's bit for bit.

HBM traffic: read x twice, write y once (plus read the residual and write ``s`` once with a residual), against about
12 passes for eager channels-last GroupNorm + swish. Backward (for VQGAN fitting) is two passes over (x, dy) with the
small per-(sample, channel) reductions finished in torch. All arithmetic is fp32; loads are cast to fp32 and results
cast back to the storage dtype once (the Triton interpreter's bf16 arithmetic is wrong, and this is also what makes
the GPU kernel more accurate than the eager bf16 swish).

Layouts: any (B, C, H, W) tensor whose H and W strides merge (channels-last or contiguous NCHW); the kernels take
strides, and Triton specialises the unit stride, so channels-last loads are coalesced along C.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Literal, overload

import torch
import torch.nn.functional as F

from procap.kernels._common import as_stored, memory_layout, round_to_bf16_rne, row_strides
from procap.kernels.dispatch import INTERPRETED, FusedOp, register, require_triton_tensor, run, tl, triton, triton_jit
from procap.kernels.occupancy import resident_programs, sm_resources

# The persistent statistics kernel is compiled once for any chunking: its chunk and item counts are not specialised
# on (as 1 or multiples of 16), so the kernel that sized the grid (resident_programs) is the one that runs.
_persistent_jit = (
    triton.jit(do_not_specialize=["rows_per_chunk", "n_chunks", "n_items"]) if triton is not None else triton_jit
)

# Elements per (rows x channels) tile. The interpreter's cost is per program (numpy works on whole tiles).
TILE_ELEMENTS = 16384 if INTERPRETED else 4096
# The barrier-free statistics kernel keeps two fp32 accumulators per element of its tile: 64 rows x 128 channels
# over 8 warps is 64 registers of them per thread, and twice the bytes in flight per iteration of the 4-warp tile.
STATS_TILE_ELEMENTS = 16384 if INTERPRETED else 8192
# With both a residual and an in_bias the loop also holds the second loaded tile and a bias per channel: in fp16/bf16
# more than the 128 registers a thread that let two 8-warp blocks share an SM (bf16: 135 under ptxas 12.8), so
# Triton 3.6 spilled in fp16 and 3.9 sat at exactly 128. Half the rows: about 80 (three blocks per SM; fp32 about
# 170 -> about 100, two instead of one), loading as many bytes per iteration as the one-input tile. The statistics
# then differ only in fp32 summation order (which lane adds which row, where chunks start).
STATS_TILE_ELEMENTS_RESIDUAL_IN_BIAS = STATS_TILE_ELEMENTS // 2
STATS_NUM_WARPS = 8
STATS_PROGRAMS_PER_SM = 8
MAX_BLOCK_C = 128  # channel tile; the VQGAN's 128/256/512 channels are 1/2/4 tiles
BLOCK_S = 16  # chunks merged per step in the finalize kernel
BLOCK_G_MIN = 16

# The forward's paths (``group_norm(..., path=...)``; the VQGAN's fused form takes them as ``group_norm``):
# "chunked", the three launches above (the default); "persistent", the statistics by as many programs as stay
# resident at once, each taking work items in turn with two row tiles in flight, then the parallel finalize; and
# "single_kernel", one launch where a program holds whole groups (single_kernel_tiling), else "persistent".
GROUP_NORM_PATHS = ("chunked", "persistent", "single_kernel")
# Work items cost their row tiles plus about one tile's worth of fixed work (the shift row, the block reductions,
# the partials' stores): persistent_chunks weighs fewer, longer items against an even share per program.
ITEM_OVERHEAD_TILES = 1
# The persistent kernel holds the next tile's loads beside its accumulators: with the chunked kernel's tiles it took
# 126-173 registers in fp16/bf16 (one 8-warp CTA per SM; sm_90, Triton 3.9), with half the rows 70-112 (two or three).
PERSISTENT_TILE_DIVISOR = 2
FALLBACK_CTAS_PER_SM = 2  # without compiled metadata (interpreter, compile check): what 128 registers x 8 warps allow
# The parallel finalize: FINALIZE_LANES channel lanes (whole groups) by FINALIZE_TILE // lanes chunks per step.
FINALIZE_LANES = 16
FINALIZE_TILE_ELEMENTS = 1024
FINALIZE_NUM_WARPS = 4
# The single-kernel path keeps a program's whole tile (rows x channels of its groups) in fp32 registers: at most 8192
# elements over 8 warps is 32 a thread (64 with the deviations), clear of spills; at least 16 channels a row.
SINGLE_KERNEL_MAX_ELEMENTS = 8192
SINGLE_KERNEL_LANES = 16


def group_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    num_groups: int,
    eps: float = 1e-6,
    silu: bool = False,
    residual: torch.Tensor | None = None,
    in_bias: torch.Tensor | None = None,
    return_sum: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference: ``F.group_norm`` then taming's swish ``y * sigmoid(y)``, in the input dtype (the eager model).

    Args:
        x: (B, C, H, W) activations; residual: optional tensor of the same shape added to x first.
        weight, bias: (C,) affine parameters.
        num_groups: G, dividing C.
        eps: added to the variance.
        silu: apply ``y * sigmoid(y)`` after the affine normalisation.
        in_bias: optional (C,) per-channel vector added to x before the residual (the bias of the bias-free
            convolution that produced x).
        return_sum: also return the normalised input ``s`` when there is no residual.

    Returns:
        y (B, C, H, W) in x's dtype, or ``(y, s)`` with ``s = (x + in_bias) + residual`` when a residual is given
        or ``return_sum`` is set.
    """
    s = x
    if in_bias is not None:
        s = s + in_bias.to(s.dtype).view(1, -1, 1, 1)
    if residual is not None:
        s = s + residual
    # CUDA's group_norm wants the affine parameters in the input's dtype (CPU accepts fp32 ones with bf16 input).
    y = F.group_norm(s, num_groups, weight.to(s.dtype), bias.to(s.dtype), eps)
    if silu:
        y = y * torch.sigmoid(y)
    return (y, s) if residual is not None or return_sum else y


@triton_jit
def _silu_grad(z):
    """d silu(z) / dz = sigmoid(z) * (1 + z * (1 - sigmoid(z)))."""
    sig = tl.sigmoid(z)
    return sig * (1.0 + z * (1.0 - sig))


@triton_jit
def _channel_tile(tile, C, BLOCK_C: tl.constexpr):
    """The channels of channel tile ``tile`` and which of them exist: ``(cols, col_ok)``."""
    cols = tile * BLOCK_C + tl.arange(0, BLOCK_C)
    return cols, cols < C


@triton_jit
def _channel_block(C, BLOCK_C: tl.constexpr):
    """The channels of this program's block (grid axis 2) and which of them exist: ``(cols, col_ok)``."""
    return _channel_tile(tl.program_id(2), C, BLOCK_C)


@triton_jit
def _tile(base, rows, row_stop, cols, col_ok, stride_hw, stride_c):
    """``(ok, offs)`` of the tile of ``rows`` (those below ``row_stop`` exist) by the channels ``cols`` of the sample
    starting at ``base``: the mask and the int64 element offsets of every tile load and store. The caller makes
    ``rows`` (its ``tl.arange``): built in here, ptxas spilled the fp32 SiLU apply kernel with an input bias."""
    offs = base + rows.to(tl.int64)[:, None] * stride_hw + cols[None, :] * stride_c
    return (rows < row_stop)[:, None] & col_ok[None, :], offs


@triton_jit
def _channel_in_bias(IB_ptr, cols, col_ok, HAS_IN_BIAS: tl.constexpr, BLOCK_C: tl.constexpr):
    """The fp32 input bias of the channels ``cols`` (zeros without one), loaded once per program."""
    in_bias = tl.zeros((BLOCK_C,), dtype=tl.float32)
    if HAS_IN_BIAS:
        in_bias = tl.load(IB_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    return in_bias


@triton_jit
def _load_raw(X_ptr, R_ptr, offs, ok, HAS_RESIDUAL: tl.constexpr):
    """x and the residual (0.0 without one) as stored: loads issued apart from the arithmetic that uses them, so a
    loop can have the next tile's in flight while it sums this one."""
    x = tl.load(X_ptr + offs, mask=ok, other=0.0)
    r = 0.0
    if HAS_RESIDUAL:
        r = tl.load(R_ptr + offs, mask=ok, other=0.0)
    return x, r


@triton_jit
def _add_inputs(x, r, in_bias, X_ptr, HAS_RESIDUAL: tl.constexpr, HAS_IN_BIAS: tl.constexpr, ROUND_BF16: tl.constexpr):
    """The tensor the norm sees, in fp32, from loaded x and r: ``(x + in_bias) + r``, each add rounded like the
    reference's."""
    x = x.to(tl.float32)
    if HAS_IN_BIAS:  # the bias of the convolution that produced x, never materialised on its own
        x = as_stored(x + in_bias, X_ptr, ROUND_BF16)
    if HAS_RESIDUAL:
        x = as_stored(x + r.to(tl.float32), X_ptr, ROUND_BF16)
    return x


@triton_jit
def _summed_input(
    X_ptr,
    R_ptr,
    offs,
    ok,
    in_bias,
    HAS_RESIDUAL: tl.constexpr,
    HAS_IN_BIAS: tl.constexpr,
    ROUND_BF16: tl.constexpr,
):
    """The tensor the norm sees, in fp32: ``(x + in_bias) + residual``, each add rounded like the reference's."""
    x, r = _load_raw(X_ptr, R_ptr, offs, ok, HAS_RESIDUAL)
    return _add_inputs(x, r, in_bias, X_ptr, HAS_RESIDUAL, HAS_IN_BIAS, ROUND_BF16)


@triton_jit
def _tile_sums(
    X_ptr,
    S_ptr,
    x,
    r,
    offs,
    ok,
    in_bias,
    shift,
    acc,
    acc_sq,
    HAS_RESIDUAL: tl.constexpr,
    HAS_IN_BIAS: tl.constexpr,
    WRITE_SUM: tl.constexpr,
    ROUND_BF16: tl.constexpr,
):
    """One loaded tile summed (stored with ``WRITE_SUM``) and added to the running sums of ``d = s - shift``, d^2."""
    s = _add_inputs(x, r, in_bias[None, :], X_ptr, HAS_RESIDUAL, HAS_IN_BIAS, ROUND_BF16)
    if WRITE_SUM:
        tl.store(S_ptr + offs, s.to(S_ptr.dtype.element_ty), mask=ok)
    return _shifted_sums(acc, acc_sq, s, shift, ok)


@triton_jit
def _shifted_sums(acc, acc_sq, s, shift, ok):
    """The running per-lane sums of ``d = s - shift[c]`` and ``d * d`` with the tile ``s`` added (where ``ok``): what
    :func:`_store_partials` reduces, whoever produced the tile (``procap.kernels.conv_in``'s convolution too)."""
    d = tl.where(ok, s - shift[None, :], 0.0)
    return acc + d, acc_sq + d * d


@triton_jit
def _chunk_sums(
    X_ptr,
    R_ptr,
    S_ptr,
    in_bias,
    base,
    start,
    stop,
    cols,
    col_ok,
    stride_hw,
    stride_c,
    HAS_RESIDUAL: tl.constexpr,
    HAS_IN_BIAS: tl.constexpr,
    WRITE_SUM: tl.constexpr,
    ROUND_BF16: tl.constexpr,
    BLOCK_HW: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """``(shift, acc, acc_sq)`` of rows [start, stop) of one sample: the chunk's first row, and per lane the running
    sums of ``d = s - shift`` and ``d * d``, one tile loaded and summed at a time."""
    first = base + start.to(tl.int64) * stride_hw + cols * stride_c
    shift = _summed_input(X_ptr, R_ptr, first, col_ok, in_bias, HAS_RESIDUAL, HAS_IN_BIAS, ROUND_BF16)
    acc = tl.zeros((BLOCK_HW, BLOCK_C), dtype=tl.float32)
    acc_sq = tl.zeros((BLOCK_HW, BLOCK_C), dtype=tl.float32)
    for r0 in range(start, stop, BLOCK_HW):
        ok, offs = _tile(base, r0 + tl.arange(0, BLOCK_HW), stop, cols, col_ok, stride_hw, stride_c)
        x, r = _load_raw(X_ptr, R_ptr, offs, ok, HAS_RESIDUAL)
        acc, acc_sq = _tile_sums(
            X_ptr, S_ptr, x, r, offs, ok, in_bias, shift, acc, acc_sq, HAS_RESIDUAL, HAS_IN_BIAS, WRITE_SUM, ROUND_BF16
        )
    return shift, acc, acc_sq


@triton_jit
def _prefetched_chunk_sums(
    X_ptr,
    R_ptr,
    S_ptr,
    in_bias,
    base,
    start,
    stop,
    cols,
    col_ok,
    stride_hw,
    stride_c,
    HAS_RESIDUAL: tl.constexpr,
    HAS_IN_BIAS: tl.constexpr,
    WRITE_SUM: tl.constexpr,
    ROUND_BF16: tl.constexpr,
    BLOCK_HW: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """:func:`_chunk_sums` with two tiles in flight: the next tile's loads are issued before this tile is summed (the
    last iteration's are fully masked, so move nothing). The same sums in the same order: the same bits."""
    first = base + start.to(tl.int64) * stride_hw + cols * stride_c
    shift = _summed_input(X_ptr, R_ptr, first, col_ok, in_bias, HAS_RESIDUAL, HAS_IN_BIAS, ROUND_BF16)
    rows = tl.arange(0, BLOCK_HW)
    acc = tl.zeros((BLOCK_HW, BLOCK_C), dtype=tl.float32)
    acc_sq = tl.zeros((BLOCK_HW, BLOCK_C), dtype=tl.float32)
    ok, offs = _tile(base, start + rows, stop, cols, col_ok, stride_hw, stride_c)
    x, r = _load_raw(X_ptr, R_ptr, offs, ok, HAS_RESIDUAL)
    for r0 in range(start, stop, BLOCK_HW):
        next_ok, next_offs = _tile(base, r0 + BLOCK_HW + rows, stop, cols, col_ok, stride_hw, stride_c)
        next_x, next_r = _load_raw(X_ptr, R_ptr, next_offs, next_ok, HAS_RESIDUAL)
        # This tile's offsets are made again rather than carried: int64 offsets held across the loop cost more
        # registers than the few integer instructions that rebuild them.
        ok, offs = _tile(base, r0 + rows, stop, cols, col_ok, stride_hw, stride_c)
        acc, acc_sq = _tile_sums(
            X_ptr, S_ptr, x, r, offs, ok, in_bias, shift, acc, acc_sq, HAS_RESIDUAL, HAS_IN_BIAS, WRITE_SUM, ROUND_BF16
        )
        x, r = next_x, next_r
    return shift, acc, acc_sq


@triton_jit
def _store_partials(Mean_ptr, M2_ptr, slot, C, cols, col_ok, shift, acc, acc_sq, n):
    """A chunk's per-channel mean and M2 (``sum(d^2) - sum(d)^2 / n``: ``d`` is near the spread, so it does not
    cancel) into partial-statistics row ``slot`` = sample * chunks + chunk; the block-wide reductions happen here,
    once per chunk."""
    sum_d = tl.sum(acc, axis=0)
    sum_sq = tl.sum(acc_sq, axis=0)
    out = slot.to(tl.int64) * C + cols
    tl.store(Mean_ptr + out, shift + sum_d / n, mask=col_ok)
    tl.store(M2_ptr + out, tl.maximum(sum_sq - sum_d * (sum_d / n), 0.0), mask=col_ok)


@triton_jit
def _group_norm_stats_kernel(
    X_ptr,
    R_ptr,
    IB_ptr,
    S_ptr,
    Mean_ptr,
    M2_ptr,
    HW,
    C,
    rows_per_chunk,
    stride_b,
    stride_hw,
    stride_c,
    HAS_RESIDUAL: tl.constexpr,
    HAS_IN_BIAS: tl.constexpr,
    WRITE_SUM: tl.constexpr,
    ROUND_BF16: tl.constexpr,
    BLOCK_HW: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Grid (B, chunks, channel tiles): per-channel (mean, M2) of rows [chunk * rows_per_chunk, ...) of one sample,
    without a barrier in the loop (:func:`_chunk_sums`); with ``WRITE_SUM`` the summed input is stored."""
    pid_b = tl.program_id(0)
    pid_s = tl.program_id(1)
    cols, col_ok = _channel_block(C, BLOCK_C)
    start = pid_s * rows_per_chunk
    stop = tl.minimum(start + rows_per_chunk, HW)
    in_bias = _channel_in_bias(IB_ptr, cols, col_ok, HAS_IN_BIAS, BLOCK_C)
    shift, acc, acc_sq = _chunk_sums(
        X_ptr, R_ptr, S_ptr, in_bias, pid_b.to(tl.int64) * stride_b, start, stop, cols, col_ok, stride_hw, stride_c,
        HAS_RESIDUAL, HAS_IN_BIAS, WRITE_SUM, ROUND_BF16, BLOCK_HW, BLOCK_C,
    )  # fmt: skip
    slot = pid_b * tl.num_programs(1) + pid_s
    _store_partials(Mean_ptr, M2_ptr, slot, C, cols, col_ok, shift, acc, acc_sq, (stop - start).to(tl.float32))


@_persistent_jit
def _group_norm_stats_persistent_kernel(
    X_ptr,
    R_ptr,
    IB_ptr,
    S_ptr,
    Mean_ptr,
    M2_ptr,
    HW,
    C,
    rows_per_chunk,
    n_chunks,
    n_items,
    stride_b,
    stride_hw,
    stride_c,
    HAS_RESIDUAL: tl.constexpr,
    HAS_IN_BIAS: tl.constexpr,
    WRITE_SUM: tl.constexpr,
    ROUND_BF16: tl.constexpr,
    BLOCK_HW: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Grid (resident programs,): :func:`_group_norm_stats_kernel`'s work items (sample, chunk, channel tile), taken
    in turn by each program, with two row tiles in flight (:func:`_prefetched_chunk_sums`); the same partials."""
    c_tiles = tl.cdiv(C, BLOCK_C)
    for item in range(tl.program_id(0), n_items, tl.num_programs(0)):
        slot = item // c_tiles  # sample * n_chunks + chunk: the partial-statistics row, as the chunked grid's
        cols, col_ok = _channel_tile(item % c_tiles, C, BLOCK_C)
        start = (slot % n_chunks) * rows_per_chunk
        stop = tl.minimum(start + rows_per_chunk, HW)
        in_bias = _channel_in_bias(IB_ptr, cols, col_ok, HAS_IN_BIAS, BLOCK_C)
        shift, acc, acc_sq = _prefetched_chunk_sums(
            X_ptr, R_ptr, S_ptr, in_bias, (slot // n_chunks).to(tl.int64) * stride_b, start, stop, cols, col_ok,
            stride_hw, stride_c, HAS_RESIDUAL, HAS_IN_BIAS, WRITE_SUM, ROUND_BF16, BLOCK_HW, BLOCK_C,
        )  # fmt: skip
        _store_partials(Mean_ptr, M2_ptr, slot, C, cols, col_ok, shift, acc, acc_sq, (stop - start).to(tl.float32))


@triton_jit
def _merge_chunks(
    Mean_ptr,
    M2_ptr,
    pid_b,
    channels,
    ch_ok,
    HW,
    C,
    n_chunks,
    rows_per_chunk,
    BLOCK_S: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    """(mean, M2) over all HW rows of each channel in ``channels``, merging the per-chunk partials."""
    count = tl.zeros((BLOCK_G,), dtype=tl.float32)
    mean = tl.zeros((BLOCK_G,), dtype=tl.float32)
    m2 = tl.zeros((BLOCK_G,), dtype=tl.float32)
    for s0 in range(0, n_chunks, BLOCK_S):
        chunks = s0 + tl.arange(0, BLOCK_S)
        s_ok = chunks < n_chunks
        rows = tl.where(s_ok, tl.minimum(rows_per_chunk, HW - chunks * rows_per_chunk), 0) * 1.0
        ok = s_ok[:, None] & ch_ok[None, :]
        offs = (pid_b * n_chunks + chunks).to(tl.int64)[:, None] * C + channels[None, :]
        part_mean = tl.load(Mean_ptr + offs, mask=ok, other=0.0)
        part_m2 = tl.load(M2_ptr + offs, mask=ok, other=0.0)
        n_blk = tl.sum(rows, axis=0)
        mean_blk = tl.sum(rows[:, None] * part_mean, axis=0) / n_blk
        dev = part_mean - mean_blk[None, :]
        m2_blk = tl.sum(part_m2 + rows[:, None] * dev * dev, axis=0)
        total = count + n_blk
        delta = mean_blk - mean
        mean = mean + delta * (n_blk / total)
        m2 = m2 + m2_blk + delta * delta * (count * n_blk / total)
        count = total
    return mean, m2


@triton_jit
def _add_channel(g_mean, g_m2, c_mean, c_m2, j, HW):
    """Chan's update of a group's (mean, M2) with its channel ``j`` (HW rows, like the ``j`` channels merged before)."""
    seen = j * 1.0
    delta = c_mean - g_mean
    g_mean = g_mean + delta / (seen + 1.0)
    g_m2 = g_m2 + c_m2 + delta * delta * (HW * 1.0) * (seen / (seen + 1.0))
    return g_mean, g_m2


@triton_jit
def _rstd(m2, count, eps):
    """``1 / sqrt(M2 / count + eps)``, correctly rounded square root (the same wherever it runs)."""
    return 1.0 / tl.sqrt_rn(m2 / count + eps)


@triton_jit
def _group_stats(
    Mean_ptr,
    M2_ptr,
    pid_b,
    groups,
    g_ok,
    HW,
    C,
    G,
    n_chunks,
    rows_per_chunk,
    eps,
    BLOCK_S: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    """(mean, rstd) of the ``groups`` of one sample from the per-chunk, per-channel partials: the chunks of each
    channel merged first, then the channels of each group, one at a time (the same order wherever it runs)."""
    per_group = C // G
    g_mean = tl.zeros((BLOCK_G,), dtype=tl.float32)
    g_m2 = tl.zeros((BLOCK_G,), dtype=tl.float32)
    for j in range(per_group):  # channel j of every group at once; channels of a group hold HW rows each
        c_mean, c_m2 = _merge_chunks(
            Mean_ptr, M2_ptr, pid_b, groups * per_group + j, g_ok, HW, C, n_chunks, rows_per_chunk, BLOCK_S, BLOCK_G
        )
        g_mean, g_m2 = _add_channel(g_mean, g_m2, c_mean, c_m2, j, HW)
    return g_mean, _rstd(g_m2, HW * per_group * 1.0, eps)


@triton_jit
def _group_norm_finalize_kernel(
    Mean_ptr,
    M2_ptr,
    W_ptr,
    GMean_ptr,
    GRstd_ptr,
    CMean_ptr,
    Scale_ptr,
    HW,
    C,
    G,
    n_chunks,
    rows_per_chunk,
    eps,
    BLOCK_S: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    """Group mean / rstd of one sample, then per channel its group's mean and ``scale = rstd * w``."""
    pid_b = tl.program_id(0)
    groups = tl.arange(0, BLOCK_G)
    g_ok = groups < G
    per_group = C // G
    g_mean, rstd = _group_stats(
        Mean_ptr, M2_ptr, pid_b, groups, g_ok, HW, C, G, n_chunks, rows_per_chunk, eps, BLOCK_S, BLOCK_G
    )
    tl.store(GMean_ptr + pid_b * G + groups, g_mean, mask=g_ok)
    tl.store(GRstd_ptr + pid_b * G + groups, rstd, mask=g_ok)
    for j in range(per_group):
        channels = groups * per_group + j
        w = tl.load(W_ptr + channels, mask=g_ok, other=0.0).to(tl.float32)
        tl.store(CMean_ptr + pid_b * C + channels, g_mean, mask=g_ok)
        tl.store(Scale_ptr + pid_b * C + channels, rstd * w, mask=g_ok)


@triton_jit
def _group_lanes(tile, C, G, BLOCK_GT: tl.constexpr, BLOCK_PG: tl.constexpr):
    """The lanes of group tile ``tile``: ``BLOCK_GT`` groups of ``BLOCK_PG`` channel slots each, as ``(groups,
    channels, j, ok)`` per lane (``j``: the channel's place in its group; ``ok``: the channel exists)."""
    lanes = tl.arange(0, BLOCK_GT * BLOCK_PG)
    groups = tile * BLOCK_GT + lanes // BLOCK_PG
    j = lanes % BLOCK_PG
    per_group = C // G
    return groups, groups * per_group + j, j, (j < per_group) & (groups < G)


@triton_jit
def _group_sum(lane_values, BLOCK_GT: tl.constexpr, BLOCK_PG: tl.constexpr):
    """Per group, the sum of its lanes' values (lanes of missing channels must hold 0)."""
    return tl.sum(tl.reshape(lane_values, (BLOCK_GT, BLOCK_PG)), axis=1)


@triton_jit
def _to_lanes(group_values, BLOCK_GT: tl.constexpr, BLOCK_PG: tl.constexpr):
    """Each lane given its group's value."""
    return tl.reshape(tl.broadcast_to(group_values[:, None], (BLOCK_GT, BLOCK_PG)), (BLOCK_GT * BLOCK_PG,))


@triton_jit
def _merge_channels(c_mean, c_m2, per_group, HW, BLOCK_GT: tl.constexpr, BLOCK_PG: tl.constexpr):
    """Group (mean, M2) of ``BLOCK_GT`` groups from their channels' (one per lane), merged channel by channel in
    :func:`_group_stats`'s order (channel ``j`` picked out of its lanes exactly: a sum of it and zeros)."""
    means = tl.reshape(c_mean, (BLOCK_GT, BLOCK_PG))
    m2s = tl.reshape(c_m2, (BLOCK_GT, BLOCK_PG))
    column = tl.arange(0, BLOCK_PG)[None, :]
    g_mean = tl.zeros((BLOCK_GT,), dtype=tl.float32)
    g_m2 = tl.zeros((BLOCK_GT,), dtype=tl.float32)
    for j in range(per_group):
        c_mean_j = tl.sum(tl.where(column == j, means, 0.0), axis=1)
        c_m2_j = tl.sum(tl.where(column == j, m2s, 0.0), axis=1)
        g_mean, g_m2 = _add_channel(g_mean, g_m2, c_mean_j, c_m2_j, j, HW)
    return g_mean, g_m2


@triton_jit
def _store_statistics(W_ptr, GStats_ptr, CStats_ptr, groups, channels, j, ok, G, C, lane_mean, lane_rstd):
    """Store one program's statistics (grid axis 0: the sample): group mean and rstd in ``GStats`` (2, B, G), once
    per group, and per channel its group's mean and ``scale = rstd * w`` in ``CStats`` (2, B, C). Returns the
    lanes' scale."""
    pid_b = tl.program_id(0)
    batch = tl.num_programs(0)
    first = ok & (j == 0)
    tl.store(GStats_ptr + pid_b * G + groups, lane_mean, mask=first)
    tl.store(GStats_ptr + (batch + pid_b) * G + groups, lane_rstd, mask=first)
    scale = lane_rstd * tl.load(W_ptr + channels, mask=ok, other=0.0).to(tl.float32)
    tl.store(CStats_ptr + pid_b * C + channels, lane_mean, mask=ok)
    tl.store(CStats_ptr + (batch + pid_b) * C + channels, scale, mask=ok)
    return scale


@triton_jit
def _group_norm_finalize_tiles_kernel(
    Mean_ptr,
    M2_ptr,
    W_ptr,
    GStats_ptr,
    CStats_ptr,
    HW,
    C,
    G,
    n_chunks,
    rows_per_chunk,
    eps,
    BLOCK_S: tl.constexpr,
    BLOCK_GT: tl.constexpr,
    BLOCK_PG: tl.constexpr,
):
    """Grid (B, group tiles): :func:`_group_norm_finalize_kernel`'s statistics, every channel of ``BLOCK_GT`` groups
    in its own lane, so the chunks of all of them are merged at once (``BLOCK_S`` chunks a step) instead of one
    channel per group at a time in one program per sample; then the channels in order, as there."""
    groups, channels, j, ok = _group_lanes(tl.program_id(1), C, G, BLOCK_GT, BLOCK_PG)
    c_mean, c_m2 = _merge_chunks(
        Mean_ptr, M2_ptr, tl.program_id(0), channels, ok, HW, C, n_chunks, rows_per_chunk, BLOCK_S, BLOCK_GT * BLOCK_PG
    )
    g_mean, g_m2 = _merge_channels(c_mean, c_m2, C // G, HW, BLOCK_GT, BLOCK_PG)
    rstd = _rstd(g_m2, HW * (C // G) * 1.0, eps)
    lane_mean = _to_lanes(g_mean, BLOCK_GT, BLOCK_PG)
    _store_statistics(
        W_ptr, GStats_ptr, CStats_ptr, groups, channels, j, ok, G, C, lane_mean, _to_lanes(rstd, BLOCK_GT, BLOCK_PG)
    )


@triton_jit
def _store_normalized(Y_ptr, offs, ok, x, mean, scale, bias, SILU: tl.constexpr, ROUND_BF16: tl.constexpr):
    """Store ``y = act((x - mean) * scale + bias)`` on one tile; the per-channel vectors are (1, channels)."""
    y = (x - mean) * scale + bias
    if SILU:
        y = y * tl.sigmoid(y)
    if ROUND_BF16:
        y = round_to_bf16_rne(y)
    tl.store(Y_ptr + offs, y.to(Y_ptr.dtype.element_ty), mask=ok)


@triton_jit
def _apply_tile(
    X_ptr,
    Y_ptr,
    offs,
    ok,
    in_bias,
    mean,
    scale,
    bias,
    HAS_IN_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    ROUND_BF16: tl.constexpr,
):
    """Store ``y = act((x (+ in_bias) - mean) * scale + bias)`` on one tile (per-channel vectors: (1, BLOCK_C))."""
    x = _summed_input(X_ptr, X_ptr, offs, ok, in_bias, False, HAS_IN_BIAS, ROUND_BF16)
    _store_normalized(Y_ptr, offs, ok, x, mean, scale, bias, SILU, ROUND_BF16)


@triton_jit
def _resident_moments(s, ok, j, count, eps, BLOCK_HW: tl.constexpr, BLOCK_GT: tl.constexpr, BLOCK_PG: tl.constexpr):
    """Per lane, its group's mean and rstd from a tile holding every row of the groups. The mean is the group's
    first value (row 0 of its channel 0) plus the mean deviation from it, so a mean far above the spread loses no
    digits to the sum; then the squared deviations from that mean (two passes over the registers)."""
    s = tl.where(ok, s, 0.0)
    first = tl.sum(tl.where((tl.arange(0, BLOCK_HW) == 0)[:, None] & (j == 0)[None, :], s, 0.0), axis=0)
    shift = _to_lanes(_group_sum(first, BLOCK_GT, BLOCK_PG), BLOCK_GT, BLOCK_PG)  # a sum of one value and zeros
    d = tl.where(ok, s - shift[None, :], 0.0)
    lane_mean = shift + _to_lanes(_group_sum(tl.sum(d, axis=0), BLOCK_GT, BLOCK_PG) / count, BLOCK_GT, BLOCK_PG)
    d = tl.where(ok, s - lane_mean[None, :], 0.0)
    rstd = _rstd(_group_sum(tl.sum(d * d, axis=0), BLOCK_GT, BLOCK_PG), count, eps)
    return lane_mean, _to_lanes(rstd, BLOCK_GT, BLOCK_PG)


@triton_jit
def _group_norm_single_kernel(
    X_ptr,
    R_ptr,
    IB_ptr,
    S_ptr,
    Y_ptr,
    W_ptr,
    Bias_ptr,
    GStats_ptr,
    CStats_ptr,
    HW,
    C,
    G,
    eps,
    stride_b,
    stride_hw,
    stride_c,
    HAS_RESIDUAL: tl.constexpr,
    HAS_IN_BIAS: tl.constexpr,
    WRITE_SUM: tl.constexpr,
    SILU: tl.constexpr,
    ROUND_BF16: tl.constexpr,
    BLOCK_HW: tl.constexpr,
    BLOCK_GT: tl.constexpr,
    BLOCK_PG: tl.constexpr,
):
    """Grid (B, group tiles), for groups whose every row fits one program (:func:`single_kernel_tiling`): the summed
    input loaded once (and written with ``WRITE_SUM``), its statistics, ``y``: the three passes in one launch."""
    groups, channels, j, lane_ok = _group_lanes(tl.program_id(1), C, G, BLOCK_GT, BLOCK_PG)
    base = tl.program_id(0).to(tl.int64) * stride_b
    ok, offs = _tile(base, tl.arange(0, BLOCK_HW), HW, channels, lane_ok, stride_hw, stride_c)
    in_bias = _channel_in_bias(IB_ptr, channels, lane_ok, HAS_IN_BIAS, BLOCK_GT * BLOCK_PG)
    s = _summed_input(X_ptr, R_ptr, offs, ok, in_bias[None, :], HAS_RESIDUAL, HAS_IN_BIAS, ROUND_BF16)
    if WRITE_SUM:
        tl.store(S_ptr + offs, s.to(S_ptr.dtype.element_ty), mask=ok)
    mean, rstd = _resident_moments(s, ok, j, HW * (C // G) * 1.0, eps, BLOCK_HW, BLOCK_GT, BLOCK_PG)
    scale = _store_statistics(W_ptr, GStats_ptr, CStats_ptr, groups, channels, j, lane_ok, G, C, mean, rstd)
    bias = tl.load(Bias_ptr + channels, mask=lane_ok, other=0.0).to(tl.float32)
    _store_normalized(Y_ptr, offs, ok, s, mean[None, :], scale[None, :], bias[None, :], SILU, ROUND_BF16)


@triton_jit
def _group_norm_apply_kernel(
    X_ptr,
    IB_ptr,
    Y_ptr,
    CMean_ptr,
    Scale_ptr,
    Bias_ptr,
    HW,
    C,
    stride_b,
    stride_hw,
    stride_c,
    HAS_IN_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    ROUND_BF16: tl.constexpr,
    BLOCK_HW: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """y = act((x (+ in_bias) - mean[b, c]) * scale[b, c] + bias[c]) on a (BLOCK_HW rows, BLOCK_C channels) tile."""
    pid_b = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_HW + tl.arange(0, BLOCK_HW)
    cols, col_ok = _channel_block(C, BLOCK_C)
    ok, offs = _tile(pid_b.to(tl.int64) * stride_b, rows, HW, cols, col_ok, stride_hw, stride_c)
    in_bias = _channel_in_bias(IB_ptr, cols, col_ok, HAS_IN_BIAS, BLOCK_C)
    mean = tl.load(CMean_ptr + pid_b * C + cols, mask=col_ok, other=0.0)
    scale = tl.load(Scale_ptr + pid_b * C + cols, mask=col_ok, other=0.0)
    bias = tl.load(Bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    _apply_tile(
        X_ptr,
        Y_ptr,
        offs,
        ok,
        in_bias[None, :],
        mean[None, :],
        scale[None, :],
        bias[None, :],
        HAS_IN_BIAS,
        SILU,
        ROUND_BF16,
    )


@triton_jit
def _affine_input(X_ptr, CMean_ptr, Scale_ptr, Bias_ptr, offs, ok, per_channel, cols, col_ok):
    """(x, z) on a tile: the stored input and the affine output ``(x - mean) * scale + bias`` it was mapped to."""
    x = tl.load(X_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    mean = tl.load(CMean_ptr + per_channel, mask=col_ok, other=0.0)
    scale = tl.load(Scale_ptr + per_channel, mask=col_ok, other=0.0)
    bias = tl.load(Bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    return x, (x - mean[None, :]) * scale[None, :] + bias[None, :]


@triton_jit
def _group_norm_bwd_stats_kernel(
    X_ptr,
    DY_ptr,
    CMean_ptr,
    Scale_ptr,
    Bias_ptr,
    GRstd_ptr,
    SumDz_ptr,
    SumDzXhat_ptr,
    HW,
    C,
    G,
    rows_per_chunk,
    stride_b,
    stride_hw,
    stride_c,
    SILU: tl.constexpr,
    BLOCK_HW: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Per-channel sums over a chunk of rows of dz and dz * xhat, dz = dL/d(affine output), xhat = (x - mean) rstd."""
    pid_b = tl.program_id(0)
    pid_s = tl.program_id(1)
    cols, col_ok = _channel_block(C, BLOCK_C)
    per_channel = pid_b * C + cols
    mean = tl.load(CMean_ptr + per_channel, mask=col_ok, other=0.0)
    rstd = tl.load(GRstd_ptr + pid_b * G + cols // (C // G), mask=col_ok, other=0.0)
    start = pid_s * rows_per_chunk
    stop = tl.minimum(start + rows_per_chunk, HW)
    base = pid_b.to(tl.int64) * stride_b
    # The sample's offset folded into the pointers once: kept as an int64 offset added to every tile's, its high word
    # was spilled by ptxas 12.8 (Triton 3.6) in fp32 (docs/kernels.md, compile check).
    x_sample, dy_sample = X_ptr + base, DY_ptr + base
    acc_dz = tl.zeros((BLOCK_C,), dtype=tl.float32)
    acc_dz_xhat = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for r0 in range(start, stop, BLOCK_HW):
        ok, offs = _tile(0, r0 + tl.arange(0, BLOCK_HW), stop, cols, col_ok, stride_hw, stride_c)
        x, z = _affine_input(x_sample, CMean_ptr, Scale_ptr, Bias_ptr, offs, ok, per_channel, cols, col_ok)
        dz = tl.load(dy_sample + offs, mask=ok, other=0.0).to(tl.float32)
        if SILU:
            dz = dz * _silu_grad(z)
        acc_dz += tl.sum(dz, axis=0)
        acc_dz_xhat += tl.sum(dz * ((x - mean[None, :]) * rstd[None, :]), axis=0)
    out = (pid_b * tl.num_programs(1) + pid_s).to(tl.int64) * C + cols
    tl.store(SumDz_ptr + out, acc_dz, mask=col_ok)
    tl.store(SumDzXhat_ptr + out, acc_dz_xhat, mask=col_ok)


@triton_jit
def _group_norm_bwd_apply_kernel(
    X_ptr,
    DY_ptr,
    DS_ptr,
    DX_ptr,
    CMean_ptr,
    Scale_ptr,
    Bias_ptr,
    Alpha_ptr,
    Beta_ptr,
    Gamma_ptr,
    HW,
    C,
    stride_b,
    stride_hw,
    stride_c,
    SILU: tl.constexpr,
    HAS_DS: tl.constexpr,
    ROUND_BF16: tl.constexpr,
    BLOCK_HW: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """dx = alpha * dz + beta * (x - mean) + gamma (+ ds, the gradient reaching the residual sum directly)."""
    pid_b = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_HW + tl.arange(0, BLOCK_HW)
    cols, col_ok = _channel_block(C, BLOCK_C)
    ok, offs = _tile(pid_b.to(tl.int64) * stride_b, rows, HW, cols, col_ok, stride_hw, stride_c)
    per_channel = pid_b * C + cols
    x, z = _affine_input(X_ptr, CMean_ptr, Scale_ptr, Bias_ptr, offs, ok, per_channel, cols, col_ok)
    dz = tl.load(DY_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    if SILU:
        dz = dz * _silu_grad(z)
    mean = tl.load(CMean_ptr + per_channel, mask=col_ok, other=0.0)
    alpha = tl.load(Alpha_ptr + per_channel, mask=col_ok, other=0.0)
    beta = tl.load(Beta_ptr + per_channel, mask=col_ok, other=0.0)
    gamma = tl.load(Gamma_ptr + per_channel, mask=col_ok, other=0.0)
    dx = alpha[None, :] * dz + beta[None, :] * (x - mean[None, :]) + gamma[None, :]
    if HAS_DS:
        dx += tl.load(DS_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    if ROUND_BF16:
        dx = round_to_bf16_rne(dx)
    tl.store(DX_ptr + offs, dx.to(DX_ptr.dtype.element_ty), mask=ok)


def _blocks(channels: int, block_hw: int | None, tile_elements: int = TILE_ELEMENTS) -> tuple[int, int]:
    block_c = min(triton.next_power_of_2(channels), MAX_BLOCK_C)
    return (block_hw or max(16, tile_elements // block_c)), block_c


def _chunks(
    batch: int,
    hw: int,
    c_tiles: int,
    block_hw: int,
    device: torch.device,
    rows_per_chunk: int | None,
    programs_per_sm: int = 4,
) -> tuple[int, int]:
    """(rows per chunk, chunks per sample) so that a statistics pass fills the GPU (``programs_per_sm`` per SM).

    Off CUDA (the interpreter, the compile check) an H100's SM count stands in, so the same chunking is exercised.
    """
    if rows_per_chunk is None:
        programs = programs_per_sm * sm_resources(device)[0]
        chunks = max(1, min(triton.cdiv(programs, batch * c_tiles), triton.cdiv(hw, block_hw)))
        rows_per_chunk = triton.cdiv(triton.cdiv(hw, chunks), block_hw) * block_hw
    return rows_per_chunk, triton.cdiv(hw, rows_per_chunk)


def _next_power_of_2(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


@functools.cache
def persistent_chunks(batch: int, c_tiles: int, hw: int, block_hw: int, programs: int) -> tuple[int, int]:
    """(rows per chunk, chunks per sample) for ``programs`` resident programs taking the (sample, chunk, channel
    tile) items of a persistent statistics pass in turn.

    Items go round-robin, so the busiest program has ``ceil(items / programs)`` of them, each costing its row tiles
    plus :data:`ITEM_OVERHEAD_TILES`. Of every whole number of tiles per chunk (evened out over the sample's
    tiles), the chunking whose busiest program does the least; on a tie the fewer chunks (fewer partials).
    """
    tiles = -(-hw // block_hw)
    best: tuple[tuple[int, int], int] | None = None
    for chunks in range(1, tiles + 1):
        per_chunk = -(-tiles // chunks)
        if -(-tiles // per_chunk) != chunks:  # as many tiles a chunk as a smaller count: that one was weighed
            continue
        rounds = -(-(batch * c_tiles * chunks) // programs)
        cost = (rounds * (per_chunk + ITEM_OVERHEAD_TILES), chunks)
        if best is None or cost < best[0]:
            best = (cost, per_chunk)
    assert best is not None  # one tile at least: hw >= 1
    rows = best[1] * block_hw
    return rows, -(-hw // rows)


def finalize_tiling(groups: int, per_group: int) -> tuple[int, int, int]:
    """``(BLOCK_S, BLOCK_GT, BLOCK_PG)`` of the parallel finalize: chunks merged per step, groups per program and
    channel lanes per group (a power of two: lanes past ``per_group`` are masked); about :data:`FINALIZE_LANES`
    lanes a program and :data:`FINALIZE_TILE_ELEMENTS` partials a step."""
    block_pg = _next_power_of_2(per_group)
    block_gt = max(1, min(_next_power_of_2(groups), FINALIZE_LANES // block_pg))
    return max(1, FINALIZE_TILE_ELEMENTS // (block_gt * block_pg)), block_gt, block_pg


def single_kernel_tiling(hw: int, channels: int, groups: int) -> tuple[int, int, int] | None:
    """``(BLOCK_HW, BLOCK_GT, BLOCK_PG)`` of the single-kernel path, or None where a group's rows by its channels
    (each a power of two) exceed :data:`SINGLE_KERNEL_MAX_ELEMENTS`: the three-pass path runs there. A program takes
    as many groups as make :data:`SINGLE_KERNEL_LANES` channels (wider rows load in longer runs), within the limit."""
    block_hw, block_pg = _next_power_of_2(hw), _next_power_of_2(channels // groups)
    if block_hw * block_pg > SINGLE_KERNEL_MAX_ELEMENTS:
        return None
    fit = SINGLE_KERNEL_MAX_ELEMENTS // (block_hw * block_pg)
    block_gt = max(1, min(_next_power_of_2(groups), SINGLE_KERNEL_LANES // block_pg, fit))
    return block_hw, block_gt, block_pg


def _check(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    num_groups: int,
    residual: torch.Tensor | None,
    in_bias: torch.Tensor | None = None,
    path: str = "chunked",
) -> None:
    if x.dim() != 4:
        raise ValueError(f"the fused group norm takes (B, C, H, W) tensors, got shape {tuple(x.shape)}")
    if x.shape[1] % num_groups or weight.shape != (x.shape[1],) or bias.shape != (x.shape[1],):
        raise ValueError(
            f"{x.shape[1]} channels, {num_groups} groups, weight {tuple(weight.shape)} and bias "
            f"{tuple(bias.shape)} do not fit together"
        )
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} differs from x {tuple(x.shape)} {x.dtype}")
    if in_bias is not None and in_bias.shape != (x.shape[1],):
        raise ValueError(f"in_bias must have shape ({x.shape[1]},), got {tuple(in_bias.shape)}")
    if path not in GROUP_NORM_PATHS:
        raise ValueError(f"path must be one of {', '.join(GROUP_NORM_PATHS)}, got {path!r}")
    require_triton_tensor(x, "group norm")


@dataclass(frozen=True)
class _Tiling:
    """How a group norm pass over x (B, C, H, W) is cut: positions per tile (the statistics kernels' and the apply
    kernel's), channels per tile, and the chunks of rows each sample's statistics are summed in."""

    batch: int
    channels: int
    hw: int
    stats_hw: int
    apply_hw: int
    block_c: int
    c_tiles: int
    rows_per_chunk: int
    n_chunks: int

    @classmethod
    def plan(
        cls,
        x: torch.Tensor,
        block_hw: int | None,
        rows_per_chunk: int | None,
        stats_tile: int,
        programs_per_sm: int,
    ) -> _Tiling:
        """``block_hw`` / ``rows_per_chunk``: forced sizes or None; ``stats_tile``: the elements of a statistics
        tile; ``programs_per_sm``: how many statistics programs each SM should get."""
        batch, channels, height, width = x.shape
        hw = height * width
        stats_hw, block_c = _blocks(channels, block_hw, stats_tile)
        apply_hw, _ = _blocks(channels, block_hw)
        c_tiles = triton.cdiv(channels, block_c)
        rows, n_chunks = _chunks(batch, hw, c_tiles, stats_hw, x.device, rows_per_chunk, programs_per_sm)
        return cls(batch, channels, hw, stats_hw, apply_hw, block_c, c_tiles, rows, n_chunks)


@dataclass(frozen=True)
class _Inputs:
    """What the forward kernels read and write, in one layout: x, the residual and the in_bias (x itself when absent:
    the kernels take a pointer either way) and the sum ``s`` (x itself when it is not written)."""

    x: torch.Tensor
    residual: torch.Tensor
    in_bias: torch.Tensor
    s: torch.Tensor
    has_residual: bool
    has_in_bias: bool

    @classmethod
    def of(
        cls, x: torch.Tensor, residual: torch.Tensor | None, in_bias: torch.Tensor | None, write_sum: bool
    ) -> _Inputs:
        layout = memory_layout(x)
        x = x.contiguous(memory_format=layout)
        r = x if residual is None else residual.contiguous(memory_format=layout)
        ib = x if in_bias is None else in_bias.to(x.dtype).contiguous()  # rounded like the reference's eager add
        return cls(x, r, ib, torch.empty_like(x) if write_sum else x, residual is not None, in_bias is not None)

    @property
    def stats_tile(self) -> int:
        """Elements of a statistics tile (fewer rows with both a residual and an in_bias: see the constants)."""
        return STATS_TILE_ELEMENTS_RESIDUAL_IN_BIAS if self.has_residual and self.has_in_bias else STATS_TILE_ELEMENTS

    @property
    def persistent_stats_tile(self) -> int:
        """The persistent kernel's tile: half the rows (it holds a second tile in flight), and in fp32 half again,
        the same bytes as in 16 bits (fp32 with a residual spilled at the 16-bit element count)."""
        return self.stats_tile // PERSISTENT_TILE_DIVISOR // max(1, self.x.element_size() // 2)

    def flags(self) -> dict[str, bool]:
        """The statistics and single kernels' constexprs for these inputs."""
        return {
            "HAS_RESIDUAL": self.has_residual,
            "HAS_IN_BIAS": self.has_in_bias,
            "WRITE_SUM": self.s is not self.x,
            "ROUND_BF16": INTERPRETED and self.x.dtype == torch.bfloat16,
        }


def group_norm_fwd(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    num_groups: int,
    eps: float,
    silu: bool,
    residual: torch.Tensor | None = None,
    *,
    in_bias: torch.Tensor | None = None,
    write_sum: bool | None = None,
    block_hw: int | None = None,
    rows_per_chunk: int | None = None,
    path: str = "chunked",
    programs: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the forward kernels.

    Args:
        x: (B, C, H, W); residual: optional, same shape and dtype; weight, bias: (C,).
        in_bias: optional (C,) vector added to x first (the bias of the convolution that produced x).
        write_sum: store ``s = (x + in_bias) + residual`` (default: whenever it differs from x). Without it an
            in_bias is added again where the apply kernel reads x, and ``s`` is returned as None.
        block_hw, rows_per_chunk: tile and chunk sizes (None: chosen here; tests force small ones; forced sizes
            keep the single-kernel path to the three passes).
        path: one of :data:`GROUP_NORM_PATHS`. programs: the persistent statistics grid (None: what stays resident).

    Returns:
        ``(y, s, mean, rstd, channel_mean, scale)``: y and ``s`` (x itself when nothing is added, None when not
        written) in x's layout and dtype; fp32 group mean and rstd (B, G); fp32 per-channel mean and
        ``rstd * weight`` (B, C).
    """
    _check(x, weight, bias, num_groups, residual, in_bias, path)
    summed = residual is not None or in_bias is not None
    write_sum = _sum_written(residual, summed, write_sum)
    inputs = _Inputs.of(x, residual, in_bias, write_sum)
    single = None
    if path == "single_kernel" and block_hw is None and rows_per_chunk is None:
        single = single_kernel_tiling(x.shape[2] * x.shape[3], x.shape[1], num_groups)
    if single is not None:
        y, group_stats, channel_stats = _forward_single(inputs, weight, bias, num_groups, eps, silu, single)
    else:
        sizes = (block_hw, rows_per_chunk, programs)
        y, group_stats, channel_stats = _forward_passes(inputs, weight, bias, (num_groups, eps, silu), path, sizes)
    kept = inputs.s if write_sum or not summed else None
    return y, kept, group_stats[0], group_stats[1], channel_stats[0], channel_stats[1]


def _sum_written(residual: torch.Tensor | None, summed: bool, write_sum: bool | None) -> bool:
    """Whether the forward stores ``s``: as asked (by default whenever it differs from x), never when nothing is
    added, and always with a residual, whose sum the apply kernel reads."""
    written = summed if write_sum is None else write_sum and summed
    if residual is not None and not written:
        raise ValueError("with a residual the sum is always written (the apply kernel reads it)")
    return written


def _forward_passes(
    inputs: _Inputs,
    weight: torch.Tensor,
    bias: torch.Tensor,
    norm: tuple[int, float, bool],
    path: str,
    sizes: tuple[int | None, int | None, int | None],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three passes: partial statistics (the chunked grid, or persistent), their finalize (one program per
    sample, or the parallel one), the apply pass. ``norm``: (groups, eps, silu); ``sizes``: forced block_hw,
    rows_per_chunk, programs. Returns y and the stacked statistics (see :func:`_statistics_buffers`)."""
    num_groups, eps, silu = norm
    block_hw, rows_per_chunk, programs = sizes
    if path == "chunked":
        tiling = _Tiling.plan(inputs.x, block_hw, rows_per_chunk, inputs.stats_tile, STATS_PROGRAMS_PER_SM)
        part_mean, part_m2 = _forward_partial_stats(inputs, tiling)
        group_stats, channel_stats = _forward_finalize(part_mean, part_m2, weight, num_groups, eps, tiling)
    else:
        tiling, (part_mean, part_m2) = _persistent_partial_stats(inputs, block_hw, rows_per_chunk, programs)
        group_stats, channel_stats = _finalize_tiles(part_mean, part_m2, weight, num_groups, eps, tiling)
    y = _forward_apply(inputs, bias, channel_stats, silu, tiling)
    return y, group_stats, channel_stats


def _partial_buffers(tiling: _Tiling, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The partial statistics, mean and M2 (B, chunks, C) fp32: row ``b * chunks + s``, channel c holds the mean and
    M2 of channel c over rows [s * rows_per_chunk, (s + 1) * rows_per_chunk) of sample b, whichever pass wrote it."""
    shape = (tiling.batch, tiling.n_chunks, tiling.channels)
    return torch.empty(shape, dtype=torch.float32, device=device), torch.empty(
        shape, dtype=torch.float32, device=device
    )


def _statistics_buffers(batch: int, groups: int, channels: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """The finalized statistics, fp32: group mean and rstd stacked (2, B, G), channel mean and scale (2, B, C)."""
    return (
        torch.empty(2, batch, groups, dtype=torch.float32, device=device),
        torch.empty(2, batch, channels, dtype=torch.float32, device=device),
    )


def _forward_partial_stats(inputs: _Inputs, tiling: _Tiling) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked statistics pass, grid (B, chunks, channel tiles): the partials of ``(x + in_bias) + residual``
    (:func:`_partial_buffers`), the sum written to ``s`` when ``s`` is not x."""
    x = inputs.x
    part_mean, part_m2 = _partial_buffers(tiling, x.device)
    _group_norm_stats_kernel[(tiling.batch, tiling.n_chunks, tiling.c_tiles)](
        x,
        inputs.residual,
        inputs.in_bias,
        inputs.s,
        part_mean,
        part_m2,
        tiling.hw,
        tiling.channels,
        tiling.rows_per_chunk,
        *row_strides(x),
        **inputs.flags(),
        BLOCK_HW=tiling.stats_hw,
        BLOCK_C=tiling.block_c,
        num_warps=4 if INTERPRETED else STATS_NUM_WARPS,
    )
    return part_mean, part_m2


def _persistent_partial_stats(
    inputs: _Inputs, block_hw: int | None, rows_per_chunk: int | None, programs: int | None
) -> tuple[_Tiling, tuple[torch.Tensor, torch.Tensor]]:
    """The persistent statistics pass: a grid of the programs that stay resident together (from the compiled
    kernel's registers, :func:`procap.kernels.occupancy.resident_programs`), each taking the work items of
    :func:`persistent_chunks` in turn; the same partials as the chunked pass (None: sizes chosen here)."""
    x = inputs.x
    tiling = _Tiling.plan(x, block_hw, rows_per_chunk, inputs.persistent_stats_tile, 1)
    meta = {**inputs.flags(), "BLOCK_HW": tiling.stats_hw, "BLOCK_C": tiling.block_c}
    meta["num_warps"] = 4 if INTERPRETED else STATS_NUM_WARPS
    kernel = _group_norm_stats_persistent_kernel
    if programs is None:
        probe = _persistent_arguments(inputs, tiling, None)
        programs = resident_programs(kernel, probe, meta, x.device, FALLBACK_CTAS_PER_SM)
    if rows_per_chunk is None:  # the plan's chunks were the chunked grid's: these share the work among `programs`
        rows, chunks = persistent_chunks(tiling.batch, tiling.c_tiles, tiling.hw, tiling.stats_hw, programs)
        tiling = dataclasses.replace(tiling, rows_per_chunk=rows, n_chunks=chunks)
    partials = _partial_buffers(tiling, x.device)
    items = tiling.batch * tiling.n_chunks * tiling.c_tiles
    kernel[(min(programs, items),)](*_persistent_arguments(inputs, tiling, partials), **meta)
    return tiling, partials


def _persistent_arguments(
    inputs: _Inputs, tiling: _Tiling, partials: tuple[torch.Tensor, torch.Tensor] | None
) -> tuple[torch.Tensor | int, ...]:
    """The persistent statistics kernel's arguments but its constexprs; ``partials`` None: a probe for
    :func:`~procap.kernels.occupancy.resident_programs` (placeholder buffers, and counts it does not specialise on)."""
    x = inputs.x
    counts = (tiling.rows_per_chunk, tiling.n_chunks, tiling.batch * tiling.n_chunks * tiling.c_tiles)
    if partials is None:
        partials = (torch.empty(1, dtype=torch.float32, device=x.device),) * 2
        counts = (1, 1, 1)
    part_mean, part_m2 = partials
    head = (x, inputs.residual, inputs.in_bias, inputs.s, part_mean, part_m2, tiling.hw, tiling.channels)
    return head + counts + row_strides(x)


def _forward_apply(
    inputs: _Inputs, bias: torch.Tensor, channel_stats: torch.Tensor, silu: bool, tiling: _Tiling
) -> torch.Tensor:
    """The forward's last pass: ``y = act((s [+ in_bias] - channel_mean) * scale + bias)`` in s's layout (the
    in_bias added here when the sum was not stored)."""
    s = inputs.s
    y = torch.empty_like(s)
    _group_norm_apply_kernel[(tiling.batch, triton.cdiv(tiling.hw, tiling.apply_hw), tiling.c_tiles)](
        s,
        inputs.in_bias,
        y,
        channel_stats[0],
        channel_stats[1],
        bias.contiguous(),
        tiling.hw,
        tiling.channels,
        *row_strides(s),
        HAS_IN_BIAS=inputs.has_in_bias and s is inputs.x,
        SILU=silu,
        ROUND_BF16=INTERPRETED and s.dtype == torch.bfloat16,
        BLOCK_HW=tiling.apply_hw,
        BLOCK_C=tiling.block_c,
        num_warps=4,
    )
    return y


def _forward_finalize(
    part_mean: torch.Tensor, part_m2: torch.Tensor, weight: torch.Tensor, num_groups: int, eps: float, tiling: _Tiling
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunks' statistics combined by one program per sample (:func:`_statistics_buffers`)."""
    group_stats, channel_stats = _statistics_buffers(tiling.batch, num_groups, tiling.channels, part_mean.device)
    _group_norm_finalize_kernel[(tiling.batch,)](
        part_mean,
        part_m2,
        weight.contiguous(),
        group_stats[0],
        group_stats[1],
        channel_stats[0],
        channel_stats[1],
        tiling.hw,
        tiling.channels,
        num_groups,
        tiling.n_chunks,
        tiling.rows_per_chunk,
        eps,
        BLOCK_S=BLOCK_S,
        BLOCK_G=max(BLOCK_G_MIN, triton.next_power_of_2(num_groups)),
        num_warps=1,
    )
    return group_stats, channel_stats


def group_norm_from_partial_stats(
    s: torch.Tensor,
    part_mean: torch.Tensor,
    part_m2: torch.Tensor,
    rows_per_chunk: int,
    weight: torch.Tensor,
    bias: torch.Tensor,
    num_groups: int,
    eps: float,
    silu: bool,
) -> torch.Tensor:
    """The forward's finalize and apply passes over statistics another kernel wrote while it produced ``s``.

    For a producer that already holds every element of ``s`` (``procap.kernels.conv_in``: the convolution writing
    the first norm's input), so the statistics pass that would read ``s`` again is skipped.

    Args:
        s: (B, C, H, W) the tensor to normalise, dense (channels-last or NCHW).
        part_mean, part_m2: the partial statistics of ``s`` (:func:`_partial_buffers`' layout, as
            :func:`_store_partials` writes it), ``rows_per_chunk`` rows a chunk.
        weight, bias, num_groups, eps, silu: as :func:`group_norm_ref`'s.

    Returns:
        ``act(group_norm(s))`` in s's dtype and layout.
    """
    _check(s, weight, bias, num_groups, None)
    batch, channels, height, width = s.shape
    chunks = triton.cdiv(height * width, rows_per_chunk)
    for part in (part_mean, part_m2):
        if part.shape != (batch, chunks, channels) or part.dtype != torch.float32:
            raise ValueError(
                f"partial statistics must be fp32 of shape {(batch, chunks, channels)} for {rows_per_chunk} rows per "
                f"chunk, got {part.dtype} {tuple(part.shape)}"
            )
    inputs = _Inputs.of(s, None, None, False)
    tiling = _Tiling.plan(inputs.x, None, rows_per_chunk, inputs.stats_tile, STATS_PROGRAMS_PER_SM)
    channel_stats = _forward_finalize(part_mean, part_m2, weight, num_groups, eps, tiling)[1]
    return _forward_apply(inputs, bias, channel_stats, silu, tiling)


def _finalize_tiles(
    part_mean: torch.Tensor, part_m2: torch.Tensor, weight: torch.Tensor, num_groups: int, eps: float, tiling: _Tiling
) -> tuple[torch.Tensor, torch.Tensor]:
    """The parallel finalize, grid (B, group tiles) (:func:`finalize_tiling`): the same statistics as
    :func:`_forward_finalize`, merged in the same order but for the chunks' step, deterministic run to run."""
    block_s, block_gt, block_pg = finalize_tiling(num_groups, tiling.channels // num_groups)
    group_stats, channel_stats = _statistics_buffers(tiling.batch, num_groups, tiling.channels, part_mean.device)
    _group_norm_finalize_tiles_kernel[(tiling.batch, triton.cdiv(num_groups, block_gt))](
        part_mean,
        part_m2,
        weight.contiguous(),
        group_stats,
        channel_stats,
        tiling.hw,
        tiling.channels,
        num_groups,
        tiling.n_chunks,
        tiling.rows_per_chunk,
        eps,
        BLOCK_S=block_s,
        BLOCK_GT=block_gt,
        BLOCK_PG=block_pg,
        num_warps=FINALIZE_NUM_WARPS,
    )
    return group_stats, channel_stats


def _forward_single(
    inputs: _Inputs,
    weight: torch.Tensor,
    bias: torch.Tensor,
    num_groups: int,
    eps: float,
    silu: bool,
    blocks: tuple[int, int, int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The single-kernel forward, grid (B, group tiles): y, and the statistics as the three passes store them."""
    x = inputs.x
    block_hw, block_gt, block_pg = blocks
    batch, channels, height, width = x.shape
    y = torch.empty_like(x)
    group_stats, channel_stats = _statistics_buffers(batch, num_groups, channels, x.device)
    _group_norm_single_kernel[(batch, triton.cdiv(num_groups, block_gt))](
        x,
        inputs.residual,
        inputs.in_bias,
        inputs.s,
        y,
        weight.contiguous(),
        bias.contiguous(),
        group_stats,
        channel_stats,
        height * width,
        channels,
        num_groups,
        eps,
        *row_strides(x),
        **inputs.flags(),
        SILU=silu,
        BLOCK_HW=block_hw,
        BLOCK_GT=block_gt,
        BLOCK_PG=block_pg,
        num_warps=8 if block_hw * block_gt * block_pg > 4096 else 4,
    )
    return y, group_stats, channel_stats


def _backward_coefficients(
    sum_dz: torch.Tensor, sum_dz_xhat: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, hw: int
) -> tuple[torch.Tensor, ...]:
    """Per-(sample, channel) ``alpha, beta, gamma`` with dx = alpha * dz + beta * (x - mean) + gamma; dweight, dbias.

    GroupNorm's input gradient is ``rstd * (w * dz - mean_g(w * dz) - xhat * mean_g(w * dz * xhat))`` with means
    over the group's HW * C/G elements and ``xhat = (x - mean) * rstd``.
    """
    batch, groups = rstd.shape
    channels = weight.shape[0]
    per_group = channels // groups
    w = weight.float()
    a, b = sum_dz.sum(1), sum_dz_xhat.sum(1)  # (B, C): sums over every chunk
    c1 = (a * w).view(batch, groups, per_group).sum(-1) / (hw * per_group)  # (B, G) mean of w * dz
    c2 = (b * w).view(batch, groups, per_group).sum(-1) / (hw * per_group)  # (B, G) mean of w * dz * xhat
    alpha = rstd.repeat_interleave(per_group, dim=1) * w
    beta = (-rstd * rstd * c2).repeat_interleave(per_group, dim=1)
    gamma = (-rstd * c1).repeat_interleave(per_group, dim=1)
    return alpha.contiguous(), beta.contiguous(), gamma.contiguous(), b.sum(0), a.sum(0)


def group_norm_bwd(
    dy: torch.Tensor,
    ds: torch.Tensor | None,
    s: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    rstd: torch.Tensor,
    channel_mean: torch.Tensor,
    scale: torch.Tensor,
    silu: bool,
    *,
    block_hw: int | None = None,
    rows_per_chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward kernels.

    Args:
        dy: (B, C, H, W) gradient of y; ds: the gradient of the returned sum (same shape), or None.
        s: the normalised input saved by the forward; rstd, channel_mean, scale: its fp32 statistics.

    Returns:
        ``(dx, dweight, dbias)``: dx in s's layout and dtype (the gradient of x and of the residual), fp32 (C,) sums.
    """
    layout = memory_layout(s)
    dy = dy.contiguous(memory_format=layout)
    tiling = _Tiling.plan(s, block_hw, rows_per_chunk, TILE_ELEMENTS, 4)  # one tile size for both passes
    bias = bias.contiguous()
    sum_dz, sum_dz_xhat = _backward_partial_sums(s, dy, bias, rstd, channel_mean, scale, silu, tiling)
    alpha, beta, gamma, dweight, dbias = _backward_coefficients(sum_dz, sum_dz_xhat, weight, rstd, tiling.hw)
    ds = None if ds is None else ds.contiguous(memory_format=layout)
    dx = _backward_apply(s, dy, ds, bias, channel_mean, scale, (alpha, beta, gamma), silu, tiling)
    return dx, dweight, dbias


def _backward_apply(
    s: torch.Tensor,
    dy: torch.Tensor,
    ds: torch.Tensor | None,
    bias: torch.Tensor,
    channel_mean: torch.Tensor,
    scale: torch.Tensor,
    coefficients: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    silu: bool,
    tiling: _Tiling,
) -> torch.Tensor:
    """The backward's last pass: ``dx = alpha * dz + beta * (s - mean) + gamma`` (+ ``ds``) in s's layout."""
    alpha, beta, gamma = coefficients
    dx = torch.empty_like(s)
    _group_norm_bwd_apply_kernel[(tiling.batch, triton.cdiv(tiling.hw, tiling.apply_hw), tiling.c_tiles)](
        s,
        dy,
        dy if ds is None else ds,
        dx,
        channel_mean,
        scale,
        bias,
        alpha,
        beta,
        gamma,
        tiling.hw,
        tiling.channels,
        *row_strides(s),
        SILU=silu,
        HAS_DS=ds is not None,
        ROUND_BF16=INTERPRETED and s.dtype == torch.bfloat16,
        BLOCK_HW=tiling.apply_hw,
        BLOCK_C=tiling.block_c,
        num_warps=4,
    )
    return dx


def _backward_partial_sums(
    s: torch.Tensor,
    dy: torch.Tensor,
    bias: torch.Tensor,
    rstd: torch.Tensor,
    channel_mean: torch.Tensor,
    scale: torch.Tensor,
    silu: bool,
    tiling: _Tiling,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward's first pass: per-chunk channel sums of dz and dz * xhat (B, chunks, C) fp32, dz being the
    gradient reaching the norm's output (through the SiLU when there is one)."""
    sum_dz, sum_dz_xhat = (
        torch.empty(tiling.batch, tiling.n_chunks, tiling.channels, dtype=torch.float32, device=s.device)
        for _ in range(2)
    )
    _group_norm_bwd_stats_kernel[(tiling.batch, tiling.n_chunks, tiling.c_tiles)](
        s,
        dy,
        channel_mean,
        scale,
        bias,
        rstd,
        sum_dz,
        sum_dz_xhat,
        tiling.hw,
        tiling.channels,
        rstd.shape[1],
        tiling.rows_per_chunk,
        *row_strides(s),
        SILU=silu,
        BLOCK_HW=tiling.stats_hw,
        BLOCK_C=tiling.block_c,
        num_warps=4,
    )
    return sum_dz, sum_dz_xhat


class GroupNormFunction(torch.autograd.Function):
    """Autograd wrapper: differentiable in x, weight, bias, the residual and the in_bias (the sum's gradient too)."""

    @staticmethod
    def forward(ctx, x, weight, bias, residual, in_bias, num_groups, eps, silu, return_sum, path):
        y, s, _, rstd, channel_mean, scale = group_norm_fwd(
            x, weight, bias, num_groups, eps, silu, residual, in_bias=in_bias, path=path
        )
        ctx.save_for_backward(s, weight, bias, rstd, channel_mean, scale)
        ctx.silu, ctx.has_residual, ctx.in_bias_dtype = silu, residual is not None, None
        if in_bias is not None:
            ctx.in_bias_dtype = in_bias.dtype
        ctx.set_materialize_grads(False)  # an unused sum output must not cost a zero-filled gradient pass
        return (y, s) if residual is not None or return_sum else y

    @staticmethod
    def backward(ctx, dy, *rest):
        s, weight, bias, rstd, channel_mean, scale = ctx.saved_tensors
        ds = rest[0] if rest else None
        if dy is None:
            dy = torch.zeros_like(s)
        dx, dweight, dbias = group_norm_bwd(dy, ds, s, weight, bias, rstd, channel_mean, scale, ctx.silu)
        d_in_bias = None
        if ctx.in_bias_dtype is not None:  # a per-channel add: its gradient is dx summed over samples and positions
            d_in_bias = dx.float().sum((0, 2, 3)).to(ctx.in_bias_dtype)
        d_residual = dx if ctx.has_residual else None
        return (dx, dweight.to(weight.dtype), dbias.to(bias.dtype), d_residual, d_in_bias, None, None, None, None, None)


def group_norm_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    num_groups: int,
    eps: float = 1e-6,
    silu: bool = False,
    residual: torch.Tensor | None = None,
    in_bias: torch.Tensor | None = None,
    return_sum: bool = False,
    *,
    path: str = "chunked",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`group_norm_ref` (same arguments, same outputs) along ``path`` (one of
    :data:`GROUP_NORM_PATHS`; the backward is the same for every path)."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in _tensors(x, weight, bias, residual, in_bias)):
        return GroupNormFunction.apply(x, weight, bias, residual, in_bias, num_groups, eps, silu, return_sum, path)
    # Inference (the frozen VQGAN): no autograd context to build and keep; the statistics are dropped, and an
    # in_bias sum nobody asked for is never written (the apply kernel adds the bias again as it reads x).
    keep_sum = residual is not None or return_sum
    y, s = group_norm_fwd(
        x, weight, bias, num_groups, eps, silu, residual, in_bias=in_bias, write_sum=keep_sum or None, path=path
    )[:2]
    if not keep_sum:
        return y
    assert s is not None  # asked for, so written (or x itself when nothing is added)
    return y, s


def _tensors(*maybe: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    return tuple(t for t in maybe if t is not None)


# ----------------------------------------------------------------------------------------------- dispatch
GROUP_NORM = register(FusedOp("group_norm", group_norm_ref, group_norm_triton))  # no csrc/ version: CPU = reference
# The opt-in paths are ops of their own, with the same reference: PROCAP_KERNELS, impl= and the fallbacks apply
# to them as to the default one, and each is chosen (and reported by chosen_impl) under its own name.
GROUP_NORM_OPS = {"chunked": GROUP_NORM.name} | {
    path: register(FusedOp(f"group_norm_{path}", group_norm_ref, functools.partial(group_norm_triton, path=path))).name
    for path in GROUP_NORM_PATHS[1:]
}


# What comes back follows from the arguments: y alone without a residual or return_sum, (y, s) with a residual.
@overload
def group_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    num_groups: int,
    eps: float = ...,
    silu: bool = ...,
    residual: None = ...,
    impl: str | None = ...,
    *,
    in_bias: torch.Tensor | None = ...,
    return_sum: Literal[False] = ...,
    path: str = ...,
) -> torch.Tensor: ...


@overload
def group_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    num_groups: int,
    eps: float,
    silu: bool,
    residual: torch.Tensor,
    impl: str | None = ...,
    *,
    in_bias: torch.Tensor | None = ...,
    return_sum: bool = ...,
    path: str = ...,
) -> tuple[torch.Tensor, torch.Tensor]: ...


@overload
def group_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    num_groups: int,
    eps: float = ...,
    silu: bool = ...,
    residual: torch.Tensor | None = ...,
    impl: str | None = ...,
    *,
    in_bias: torch.Tensor | None = ...,
    return_sum: Literal[True],
    path: str = ...,
) -> tuple[torch.Tensor, torch.Tensor]: ...


@overload
def group_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    num_groups: int,
    eps: float = ...,
    silu: bool = ...,
    residual: torch.Tensor | None = ...,
    impl: str | None = ...,
    *,
    in_bias: torch.Tensor | None = ...,
    return_sum: bool = ...,
    path: str = ...,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...


def group_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    num_groups: int,
    eps: float = 1e-6,
    silu: bool = False,
    residual: torch.Tensor | None = None,
    impl: str | None = None,
    *,
    in_bias: torch.Tensor | None = None,
    return_sum: bool = False,
    path: str = "chunked",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """GroupNorm, optionally fused with SiLU, a preceding per-channel bias and residual add, through the fastest
    implementation.

    On CUDA the Triton kernels (channels-last or NCHW (B, C, H, W), fp32/fp16/bf16); elsewhere, other ranks, and
    under ``torch.compile`` (whose Inductor fuses the reference itself) :func:`group_norm_ref`.

    Args:
        x: (B, C, H, W) activations.
        weight, bias: (C,); num_groups: G dividing C; eps: added to the variance.
        silu: apply ``y * sigmoid(y)`` (taming's swish) to the normalised output.
        residual: optional tensor like x; the op then normalises ``x + residual`` and also returns that sum.
        impl: None (automatic) or one of ``procap.kernels.IMPLS`` ("reference" or "triton" for this op).
        in_bias: optional (C,) vector added to x before the residual: the bias of a convolution run without it,
            added where the norm reads its input instead of in a separate pass.
        return_sum: also return ``s = (x + in_bias) + residual`` when there is no residual.
        path: the Triton forward's kernels, one of :data:`GROUP_NORM_PATHS`: ``"chunked"`` (the default: statistics,
            finalize and apply passes), ``"persistent"`` (the statistics by the programs that stay resident, each
            with two row tiles in flight; a parallel finalize) or ``"single_kernel"`` (one launch where a program
            holds whole groups, else ``"persistent"``). The same outputs up to fp32 summation order, the same
            backward; dispatched as ops of their own (``group_norm_persistent``, ``group_norm_single_kernel``).

    Returns:
        y (B, C, H, W) in x's dtype and layout, or ``(y, s)`` with a residual or ``return_sum``.
    """
    if path not in GROUP_NORM_OPS:
        raise ValueError(f"path must be one of {', '.join(GROUP_NORM_PATHS)}, got {path!r}")
    if torch.compiler.is_compiling() or (impl is None and x.dim() != 4):
        return group_norm_ref(x, weight, bias, num_groups, eps, silu, residual, in_bias, return_sum)
    tensors = _tensors(x, weight, bias, residual, in_bias)
    requires_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    args = (x, weight, bias, num_groups, eps, silu, residual, in_bias, return_sum)
    return run(GROUP_NORM_OPS[path], impl, x, requires_grad, *args)
