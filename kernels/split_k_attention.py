"""Split-K ("flash-decoding") attention of one query row per head against a long key/value cache.

The cached decoding step attends from one query per (row, head) to the memory's ~784 cached keys (the ``clevr``
decoder at k = 2) in each layer's cross attention. PyTorch's SDPA hands that shape to a cuDNN kernel built for
query tiles (an sm80 ``wmma`` kernel with 16-row tiles on an H100: 48 launches, 1.07 ms of the batch-32 call,
docs/gpu.md), which runs one CTA per (row, head) over all the keys: 8 CTAs at batch 1, and at batch 32 about 2.3 TB/s
on 51 MB of keys and values per launch. This op spreads the keys over the grid instead:

- ``_decode_attention_split_kernel``, grid (batch x heads, key splits of ``SPLIT_KEYS``): each program the softmax
  partials of its key range in fp32 (the running maximum, the sum of exponentials, the weighted sum of values),
  tiles of ``BLOCK_KEYS`` keys merged online, written to an fp32 workspace;
- ``_decode_attention_combine_kernel``, one program per (row, head): the partials merged in split order (global
  maximum, rescaled sums), divided, stored in the query's dtype.

The split length depends on the key count alone, never on the batch, so a row's result does not depend on the rows
decoded beside it, and the merge order is fixed: deterministic, graph-capturable (no atomics, no counter to reset).
Keys and values are read through their strides: the step's (B, H, N, Dh) views of its (B, N, 2D) cache buffer go
in without a copy. No mask: the cross attention has none (the self attention, over at most 32 keys, stays on its
backend).

Contract (every implementation): ``attention_math(q, k, v)`` of ``procap.kernels.attention`` (fp32 softmax), for
q (B, H, 1, Dh) and k, v (B, H, Lk, Dh) of one floating dtype; output (B, H, 1, Dh) in q's dtype. The Triton path
differs in the fp32 summation order only. Forward only.
"""

from __future__ import annotations

import math

import torch

from procap.kernels._common import round_to_bf16_rne
from procap.kernels.attention import attention_math
from procap.kernels.dispatch import (
    INTERPRETED,
    FusedOp,
    register,
    require_triton_tensor,
    run,
    tl,
    triton,
    triton_jit,
)

SPLIT_KEYS = 64  # keys per program: 784 keys are 13 splits, 104 programs at batch 1 (8 heads), 3,328 at batch 32
BLOCK_KEYS = 64  # keys per tile: a 64 x 64 fp32 tile of keys (and one of values) is 32 registers a thread at 4 warps
MAX_SPLITS = 32  # the combine holds every split of a row in one tile: longer caches get longer splits
TILE_ELEMENTS = 4096  # keys x head dims per tile: head dims above 64 take fewer keys a tile


def decode_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Reference: :func:`procap.kernels.attention.attention_math` (the plain fp32-softmax attention)."""
    return attention_math(q, k, v)


@triton_jit
def _key_tile(q, k_ptr, v_ptr, keys, end, dims, dim_ok, key_stride):
    """One tile's scores (fp32, -inf for keys at or past ``end``) and values (fp32)."""
    key_ok = keys < end
    ok = key_ok[:, None] & dim_ok[None, :]
    k = tl.load(k_ptr + keys[:, None] * key_stride + dims[None, :], mask=ok, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + keys[:, None] * key_stride + dims[None, :], mask=ok, other=0.0).to(tl.float32)
    scores = tl.sum(k * q[None, :], axis=1)
    return tl.where(key_ok, scores, float("-inf")), v


@triton_jit
def _softmax_partials(q, k_ptr, v_ptr, first, end, dims, dim_ok, key_stride, BLOCK_N: tl.constexpr):
    """The maximum score, the sum of exponentials and the exponential-weighted values of keys ``first`` to ``end``.

    The first tile is taken before the loop: it holds at least one key, so the running maximum is finite from the
    start and no rescale ever computes ``exp(-inf - -inf)``."""
    offsets = tl.arange(0, BLOCK_N)
    scores, values = _key_tile(q, k_ptr, v_ptr, first + offsets, end, dims, dim_ok, key_stride)
    running_max = tl.max(scores, axis=0)
    weights = tl.exp(scores - running_max)
    total = tl.sum(weights, axis=0)
    acc = tl.sum(weights[:, None] * values, axis=0)
    for start in range(first + BLOCK_N, end, BLOCK_N):
        scores, values = _key_tile(q, k_ptr, v_ptr, start + offsets, end, dims, dim_ok, key_stride)
        new_max = tl.maximum(running_max, tl.max(scores, axis=0))
        rescale = tl.exp(running_max - new_max)
        weights = tl.exp(scores - new_max)
        total = total * rescale + tl.sum(weights, axis=0)
        acc = acc * rescale + tl.sum(weights[:, None] * values, axis=0)
        running_max = new_max
    return running_max, total, acc


@triton_jit
def _decode_attention_split_kernel(
    Q_ptr,
    K_ptr,
    V_ptr,
    Work_ptr,
    heads,
    keys,
    head_dim,
    split_keys,
    scale,
    kv_strides_b,
    kv_strides_h,
    kv_strides_n,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program (row x head, split): the softmax partials of ``split_keys`` keys into the fp32 workspace (the
    weighted values, then the maximum and the sum)."""
    row, split = tl.program_id(0), tl.program_id(1)
    batch, head = (row // heads).to(tl.int64), (row % heads).to(tl.int64)
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim
    q = tl.load(Q_ptr + row.to(tl.int64) * head_dim + dims, mask=dim_ok, other=0.0).to(tl.float32) * scale
    offset = batch * kv_strides_b + head * kv_strides_h
    first = split * split_keys
    end = tl.minimum(first + split_keys, keys)
    partials = _softmax_partials(q, K_ptr + offset, V_ptr + offset, first, end, dims, dim_ok, kv_strides_n, BLOCK_N)
    work = Work_ptr + (row * tl.num_programs(1) + split).to(tl.int64) * (head_dim + 2)
    tl.store(work + dims, partials[2], mask=dim_ok)
    tl.store(work + head_dim, partials[0])
    tl.store(work + head_dim + 1, partials[1])


@triton_jit
def _decode_attention_combine_kernel(
    Work_ptr,
    Out_ptr,
    head_dim,
    splits,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ROUND_BF16: tl.constexpr,
):
    """Program (row x head): the partials of every split merged in split order, normalised, in the output dtype."""
    row = tl.program_id(0).to(tl.int64)
    parts, dims = tl.arange(0, BLOCK_S), tl.arange(0, BLOCK_D)
    part_ok, dim_ok = parts < splits, dims < head_dim
    work = Work_ptr + (row * splits + parts) * (head_dim + 2)
    maxima = tl.load(work + head_dim, mask=part_ok, other=float("-inf"))
    overall = tl.max(maxima, axis=0)
    weights = tl.exp(maxima - overall)  # 0 for the tile's rows past the last split
    total = tl.sum(weights * tl.load(work + head_dim + 1, mask=part_ok, other=0.0), axis=0)
    partial = tl.load(work[:, None] + dims[None, :], mask=part_ok[:, None] & dim_ok[None, :], other=0.0)
    out = tl.sum(weights[:, None] * partial, axis=0) / total
    if ROUND_BF16:  # the interpreter's bf16 cast truncates; a GPU's rounds to nearest even
        out = round_to_bf16_rne(out)
    tl.store(Out_ptr + row * head_dim + dims, out.to(Out_ptr.dtype.element_ty), mask=dim_ok)


def split_plan(keys: int, split_keys: int = SPLIT_KEYS) -> tuple[int, int]:
    """``(splits, keys per split)`` for a cache of ``keys``: ``split_keys`` each, doubled until at most
    :data:`MAX_SPLITS` splits cover the cache (the combine holds them all)."""
    while -(-keys // split_keys) > MAX_SPLITS:
        split_keys *= 2
    return -(-keys // split_keys), split_keys


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    batch, heads, queries, head_dim = q.shape
    if queries != 1 or k.shape != v.shape or k.shape[:2] != (batch, heads) or k.shape[3] != head_dim:
        raise ValueError(
            f"decode_attention takes q (B, H, 1, Dh) and k, v (B, H, Lk, Dh), got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if not q.dtype == k.dtype == v.dtype or k.shape[2] < 1 or head_dim > 256:
        raise ValueError("decode_attention: q, k, v of one dtype, at least one key, head dims up to 256")


def decode_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    split_keys: int = SPLIT_KEYS,
    block_keys: int = BLOCK_KEYS,
) -> torch.Tensor:
    """Triton version of :func:`decode_attention_ref`: two launches, no host sync (module docstring).

    ``split_keys`` / ``block_keys`` (powers of two, a split a whole number of tiles): smaller ones let the tests
    cover many splits and the in-split loop with few keys.
    """
    _check(q, k, v)
    require_triton_tensor(q, "decode attention")
    batch, heads, _, head_dim = q.shape
    q = q.contiguous()  # read as (B x H, Dh) rows: a no-op for the step's (B, D) query rows
    if k.stride(-1) != 1 or k.stride() != v.stride():  # the kernel walks keys and values with one set of strides
        k, v = k.contiguous(), v.contiguous()
    block_d = triton.next_power_of_2(head_dim)
    block_n = min(block_keys, max(16, TILE_ELEMENTS // block_d), split_keys)
    splits, split_keys = split_plan(k.shape[2], split_keys)
    work = torch.empty(batch * heads, splits, head_dim + 2, dtype=torch.float32, device=q.device)
    out = torch.empty(batch, heads, 1, head_dim, dtype=q.dtype, device=q.device)
    _decode_attention_split_kernel[(batch * heads, splits)](
        q, k, v, work, heads, k.shape[2], head_dim, split_keys, 1.0 / math.sqrt(head_dim),
        k.stride(0), k.stride(1), k.stride(2), BLOCK_N=block_n, BLOCK_D=block_d, num_warps=4,
    )  # fmt: skip
    _decode_attention_combine_kernel[(batch * heads,)](
        work, out, head_dim, splits, BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=block_d,
        ROUND_BF16=INTERPRETED and q.dtype == torch.bfloat16, num_warps=2,
    )  # fmt: skip
    return out


# ----------------------------------------------------------------------------------------------- dispatch
DECODE_ATTENTION = register(
    FusedOp("decode_attention", decode_attention_ref, decode_attention_triton, differentiable=False)
)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, impl: str | None = None) -> torch.Tensor:
    """One query row per head against cached keys/values (module docstring): the split-K kernels on CUDA, the
    reference elsewhere.

    Args:
        q: (B, H, 1, Dh); k, v: (B, H, Lk, Dh), any strides, q's dtype.
        impl: ``None`` (the dispatch's choice), ``"reference"`` or ``"triton"``.

    Returns:
        (B, H, 1, Dh) in q's dtype.
    """
    return run("decode_attention", impl, q, False, q, k, v)
