"""Fused VQ codebook lookup: distance + running argmin over codebook tiles, as a Triton kernel.

For a tile of BLOCK_N latent rows the kernel walks the codebook in tiles of BLOCK_K codes, computes

    dist[i, j] = (||z_i||^2 + ||e_j||^2) - 2 * (z_i . e_j)            (fp32, taming-transformers' expansion)

for the tile with ``tl.dot`` (fp32 accumulation), and keeps a running (min, argmin) per row. The N x K distance
matrix never exists in memory. Ties go to the lowest index, like ``torch.argmin``: ``tl.argmin`` breaks ties to the
left inside a tile and a later tile only wins with a strictly smaller distance.

Numerics: the squared norms are computed by the host with the same torch expression as
:func:`procap.model.quantize.vq_distances_ref`, so they are bit-identical to the reference; ``2 * dot`` and the
two additions are the reference's operations in the reference's order. Only the summation order inside the dot
product differs (tiles vs. the BLAS/cuBLAS kernel), so an index can differ from the reference only where the
reference's two best distances are within a few fp32 ulps of each other. fp16/bf16 inputs feed ``tl.dot`` natively:
their products are exact in fp32 (11- and 8-bit significands), as in the reference's ``z.float() @ e.float().t()``.
fp32 inputs use ``input_precision="ieee"`` (TF32 would change indices).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

INTERPRETED = bool(triton.knobs.runtime.interpret)


@triton.jit
def _vq_nearest_kernel(
    Z_ptr,
    E_ptr,
    ZZ_ptr,
    EE_ptr,
    Idx_ptr,
    N,
    K,
    D,
    stride_z_row,
    stride_e_row,
    UPCAST: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """idx[i] = argmin_j (zz[i] + ee[j]) - 2 * z_i . e_j over the whole codebook, for BLOCK_N rows."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    zz = tl.load(ZZ_ptr + rows, mask=row_ok, other=0.0)
    best = tl.full((BLOCK_N,), float("inf"), dtype=tl.float32)
    best_idx = tl.zeros((BLOCK_N,), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        codes = k0 + tl.arange(0, BLOCK_K)
        code_ok = codes < K
        dot = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            dims = d0 + tl.arange(0, BLOCK_D)
            dim_ok = dims < D
            z = tl.load(
                Z_ptr + rows.to(tl.int64)[:, None] * stride_z_row + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :],
                other=0.0,
            )
            e = tl.load(
                E_ptr + codes.to(tl.int64)[:, None] * stride_e_row + dims[None, :],
                mask=code_ok[:, None] & dim_ok[None, :],
                other=0.0,
            )
            if UPCAST:  # the interpreter has no low-precision dot; fp32 products of fp16/bf16 values are exact
                z = z.to(tl.float32)
                e = e.to(tl.float32)
            dot = tl.dot(z, tl.trans(e), dot, input_precision="ieee")
        ee = tl.load(EE_ptr + codes, mask=code_ok, other=0.0)
        dist = (zz[:, None] + ee[None, :]) - 2.0 * dot
        dist = tl.where(code_ok[None, :], dist, float("inf"))
        tile_min = tl.min(dist, axis=1)
        tile_arg = tl.argmin(dist, axis=1, tie_break_left=True)
        better = tile_min < best  # strict: an equal distance in a later tile keeps the lower index
        best = tl.where(better, tile_min, best)
        best_idx = tl.where(better, tile_arg + k0, best_idx)
    tl.store(Idx_ptr + rows, best_idx.to(tl.int64), mask=row_ok)


def squared_norms(x: torch.Tensor) -> torch.Tensor:
    """(M, D) -> (M,) fp32 ``sum(x*x)``, the exact expression of the reference (so the values are bit-identical)."""
    x32 = x.float()
    return (x32 * x32).sum(1)


def vq_nearest_fwd(z: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """Launch the kernel.

    Args:
        z: (N, D) latents; codebook: (K, D), same dtype (fp32/fp16/bf16).

    Returns:
        (N,) int64 indices of the nearest codes.
    """
    if z.device.type != "cuda" and not INTERPRETED:
        raise ValueError(
            f"the Triton VQ kernel needs CUDA tensors, got {z.device} (set TRITON_INTERPRET=1 before "
            "importing procap.kernels.vq_triton to run it on CPU)"
        )
    if codebook.dtype != z.dtype:  # tl.dot needs equal operand types; the reference compares in fp32 anyway
        z, codebook = z.float(), codebook.float()
    z = z.contiguous()
    codebook = codebook.contiguous()
    n_rows, dim = z.shape
    n_codes = codebook.shape[0]
    indices = torch.empty(n_rows, dtype=torch.int64, device=z.device)
    if n_rows == 0:
        return indices
    block_n, block_k = 64, 64
    block_d = max(16, min(triton.next_power_of_2(dim), 64))
    grid = (triton.cdiv(n_rows, block_n),)
    _vq_nearest_kernel[grid](
        z,
        codebook,
        squared_norms(z),
        squared_norms(codebook),
        indices,
        n_rows,
        n_codes,
        dim,
        z.stride(0),
        codebook.stride(0),
        UPCAST=INTERPRETED or z.dtype == torch.float32,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        BLOCK_D=block_d,
        num_warps=4,
    )
    return indices


def vq_nearest_triton(
    z: torch.Tensor, codebook: torch.Tensor, return_quantized: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`procap.model.quantize.vq_nearest_ref` (same arguments, same outputs)."""
    indices = vq_nearest_fwd(z, codebook)
    if return_quantized:
        return indices, codebook.index_select(0, indices)
    return indices
