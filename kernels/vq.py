"""VQ codebook lookup (taming-transformers' VectorQuantizer argmin): the whole fused op in one file.

For every latent z the nearest code e_j minimises ``||z||^2 + ||e_j||^2 - 2 z . e_j``; ties go to the lowest index
(``torch.argmin``). Three implementations behind :func:`vq_nearest` (``procap.kernels.dispatch``):

- :func:`vq_nearest_ref`, the plain PyTorch reference (materialises the N x K distance matrix);
- Triton: ``_vq_nearest_kernel`` walks the codebook in tiles of BLOCK_K codes for a tile of BLOCK_N rows, computes
  ``dist = (||z||^2 + ||e||^2) - 2 * (z . e)`` with ``tl.dot`` (fp32 accumulation) and keeps a running (min, argmin),
  so the distance matrix never exists in memory. The squared norms come from the host with the reference's torch
  expression (bit-identical); only the summation order inside the dot product differs, so an index can differ only
  where the reference's two best distances are within a few fp32 ulps. fp16/bf16 products are exact in fp32;
  fp32 inputs use ``input_precision="ieee"`` (TF32 would change indices). Ties: ``tl.argmin`` breaks them to the
  left inside a tile and a later tile wins only with a strictly smaller distance.
- compiled: ``torch.ops.procap.vq_nearest`` from ``csrc/vq_cpu.cpp`` (and ``csrc/cuda/vq_cuda.cu``).
"""

from __future__ import annotations

from typing import Literal, overload

import torch

from procap.kernels import _ext
from procap.kernels.dispatch import INTERPRETED, FusedOp, register, require_triton_tensor, run, tl, triton, triton_jit


# ----------------------------------------------------------------------------------------------- reference
def _check_shapes(z: torch.Tensor, codebook: torch.Tensor) -> None:
    if z.dim() != 2 or codebook.dim() != 2 or z.shape[1] != codebook.shape[1]:
        raise ValueError(f"expected z (N, D) and codebook (K, D), got {tuple(z.shape)} and {tuple(codebook.shape)}")


def vq_distances_ref(z: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """(N, D), (K, D) -> (N, K) squared distances in fp32, in taming's expansion order."""
    z32, e32 = z.float(), codebook.float()
    return (z32 * z32).sum(1, keepdim=True) + (e32 * e32).sum(1) - 2.0 * (z32 @ e32.t())


def vq_nearest_ref(
    z: torch.Tensor, codebook: torch.Tensor, return_quantized: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Nearest codebook entry for every row of ``z``.

    Args:
        z: (N, D) latent vectors, fp32/fp16/bf16.
        codebook: (K, D) code vectors.
        return_quantized: also return ``codebook[indices]`` (in ``codebook.dtype``).

    Returns:
        (N,) int64 indices, or ``(indices, quantized)`` with quantized (N, D).
    """
    _check_shapes(z, codebook)
    indices = torch.argmin(vq_distances_ref(z, codebook), dim=1)
    if return_quantized:
        return indices, codebook[indices]
    return indices


# ----------------------------------------------------------------------------------------------- Triton
@triton_jit
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
    require_triton_tensor(z, "VQ kernel")
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
    """Triton version of :func:`vq_nearest_ref` (same arguments, same outputs)."""
    indices = vq_nearest_fwd(z, codebook)
    if return_quantized:
        return indices, codebook.index_select(0, indices)
    return indices


# ----------------------------------------------------------------------------------------------- compiled op
def _register_compiled() -> None:
    """The fake (meta) kernel, so that the compiled op traces under torch.compile."""

    @torch.library.register_fake("procap::vq_nearest")
    def _vq_nearest_fake(z, codebook):
        return z.new_empty(z.shape[0], dtype=torch.int64)


_ext.on_load(_register_compiled)  # the op exists once the library is loaded (compiled on first use)


def vq_nearest_compiled(
    z: torch.Tensor, codebook: torch.Tensor, return_quantized: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Compiled version of :func:`vq_nearest_ref` (same arguments, same outputs)."""
    indices = torch.ops.procap.vq_nearest(z.detach(), codebook.detach())  # indices carry no gradient
    if return_quantized:
        return indices, codebook.index_select(0, indices)
    return indices


# ----------------------------------------------------------------------------------------------- dispatch
VQ_NEAREST = register(
    FusedOp("vq_nearest", vq_nearest_ref, vq_nearest_triton, vq_nearest_compiled, compiled_name="vq_nearest")
)


# Indices alone unless ``return_quantized``: what comes back follows from that argument.
@overload
def vq_nearest(
    z: torch.Tensor, codebook: torch.Tensor, return_quantized: Literal[False] = ..., impl: str | None = ...
) -> torch.Tensor: ...


@overload
def vq_nearest(
    z: torch.Tensor, codebook: torch.Tensor, return_quantized: Literal[True], impl: str | None = ...
) -> tuple[torch.Tensor, torch.Tensor]: ...


@overload
def vq_nearest(
    z: torch.Tensor, codebook: torch.Tensor, return_quantized: bool = ..., impl: str | None = ...
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...


def vq_nearest(
    z: torch.Tensor, codebook: torch.Tensor, return_quantized: bool = False, impl: str | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Nearest codebook indices through the fastest implementation; see :func:`vq_nearest_ref`.

    Args:
        z: (N, D) latents; codebook: (K, D); fp32/fp16/bf16 take the fused kernels.
        return_quantized: also return ``codebook[indices]`` (N, D).
        impl: None (automatic) or one of ``procap.kernels.IMPLS``.

    Returns:
        (N,) int64 indices (ties: lowest index), or ``(indices, quantized)``.
    """
    _check_shapes(z, codebook)
    if codebook.shape[0] == 0:
        raise ValueError("the codebook is empty (K = 0)")
    return run("vq_nearest", impl, z, False, z, codebook, return_quantized)
