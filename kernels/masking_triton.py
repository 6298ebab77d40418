"""Fused multi-granularity masking with axial positional embeddings: a Triton kernel (paper Appendix C).

Forward, one pass over the visual tokens: for every row ``(b, n)`` with ``n = (t*H + h)*W + w`` the kernel rebuilds
the mask bit from :class:`~procap.model.masking.MaskParams` (same comparisons as
:func:`~procap.model.masking.mask_from_params`, so the mask is bit-identical), then writes

    out[b, n] = where(mask[b, n], e_m, x[b, n]) + ((pos_frame[t] + pos_row[h]) + pos_col[w])

in fp32, cast to ``x.dtype``. The addition order matches :func:`~procap.model.masking.masking_ref`, so the forward
output is bit-identical to the reference for fp32/fp16/bf16.

Backward, one pass over the incoming gradient: ``grad_x = grad * ~mask`` and, per position ``n``, the fp32 sums
over the batch ``S[n] = sum_b grad[b, n]`` and ``E[block] = sum_{b, n in block, masked} grad[b, n]``. The positional
table gradients are small sums of ``S`` over the other two axes, and ``grad_e_m = E.sum(0)``. No atomics: each
program owns its slice of ``S``/``E``, so gradients are deterministic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from procap.model.masking import IN_BLOCK, OUT_OF_BLOCK, RANDOM_PATCH, MaskParams

# Kernels decorated while TRITON_INTERPRET=1 run on CPU tensors through the interpreter; otherwise they need CUDA.
INTERPRETED = bool(triton.knobs.runtime.interpret)
# Rows per program. The interpreter's cost is per program (numpy works on whole tiles), so it gets larger tiles.
BLOCK_M = 128 if INTERPRETED else 16


@triton.jit
def _mask_bits(rows, row_ok, N, H, W, Scheme_ptr, Prob_ptr, U_ptr, Block_ptr, stride_u_row):
    """Mask bit (True = masked) of flattened rows ``b * N + n``; same comparisons as ``mask_from_params``."""
    b = rows // N
    n = rows % N
    h = (n // W) % H
    w = n % W
    scheme = tl.load(Scheme_ptr + b, mask=row_ok, other=0)
    prob = tl.load(Prob_ptr + b, mask=row_ok, other=0.0)
    u = tl.load(U_ptr + b * stride_u_row + n, mask=row_ok, other=1.0)
    top = tl.load(Block_ptr + b * 4 + 0, mask=row_ok, other=0)
    left = tl.load(Block_ptr + b * 4 + 1, mask=row_ok, other=0)
    height = tl.load(Block_ptr + b * 4 + 2, mask=row_ok, other=0)
    width = tl.load(Block_ptr + b * 4 + 3, mask=row_ok, other=0)
    inside = (h >= top) & (h < top + height) & (w >= left) & (w < left + width)
    # Any scheme other than the three partial ones masks everything (``entire``), like the reference's default.
    entire = (scheme != RANDOM_PATCH) & (scheme != IN_BLOCK) & (scheme != OUT_OF_BLOCK)
    masked = entire | ((scheme == RANDOM_PATCH) & (u < prob))
    masked = masked | ((scheme == IN_BLOCK) & inside) | ((scheme == OUT_OF_BLOCK) & (inside == 0))
    return masked


@triton.jit
def _round_to_bf16_rne(x):
    """Round fp32 to the nearest bf16 (ties to even), kept in fp32.

    Only for the interpreter, whose fp32 -> bf16 cast truncates; on GPUs the cast itself rounds to nearest even.
    Afterwards the truncating cast is exact, so interpreted and compiled kernels store the same bits.
    """
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _masking_fwd_kernel(
    X_ptr,
    Out_ptr,
    Mask_ptr,
    Scheme_ptr,
    Prob_ptr,
    U_ptr,
    Block_ptr,
    Em_ptr,
    PF_ptr,
    PR_ptr,
    PC_ptr,
    n_rows,
    N,
    D,
    H,
    W,
    stride_u_row,
    ROUND_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """out = where(mask, e_m, x) + ((pos_frame[t] + pos_row[h]) + pos_col[w]) on a (BLOCK_M rows, BLOCK_D) tile."""
    pid_m = tl.program_id(0)
    pid_d = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    row_ok = rows < n_rows
    col_ok = cols < D
    ok = row_ok[:, None] & col_ok[None, :]
    masked = _mask_bits(rows, row_ok, N, H, W, Scheme_ptr, Prob_ptr, U_ptr, Block_ptr, stride_u_row)

    n = rows % N
    t = n // (H * W)
    h = (n // W) % H
    w = n % W
    offs = rows.to(tl.int64)[:, None] * D + cols[None, :]  # int64: B*N*D may exceed 2**31
    # fp32 math regardless of storage dtype (also sidesteps bf16 arithmetic in the interpreter).
    x = tl.load(X_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    em = tl.load(Em_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    pf = tl.load(PF_ptr + t[:, None] * D + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    pr = tl.load(PR_ptr + h[:, None] * D + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    pc = tl.load(PC_ptr + w[:, None] * D + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    pos = (pf + pr) + pc  # same association as axial_positions()
    out = tl.where(masked[:, None], em[None, :], x) + pos
    if ROUND_BF16:
        out = _round_to_bf16_rne(out)
    tl.store(Out_ptr + offs, out.to(Out_ptr.dtype.element_ty), mask=ok)
    if pid_d == 0:  # one column tile writes the mask
        tl.store(Mask_ptr + rows, masked.to(tl.int8), mask=row_ok)


@triton.jit
def _masking_bwd_kernel(
    G_ptr, Mask_ptr, GX_ptr, S_ptr, E_ptr, B, N, D, WRITE_GX: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr
):
    """grad_x = grad * ~mask; S[n] = sum_b grad[b, n]; E[pid_m] = sum over the tile's masked rows (all fp32)."""
    pid_m = tl.program_id(0)
    pid_d = tl.program_id(1)
    n = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    n_ok = n < N
    col_ok = cols < D
    ok = n_ok[:, None] & col_ok[None, :]
    acc_s = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    acc_e = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for b in range(B):
        rows = b * N + n
        offs = rows.to(tl.int64)[:, None] * D + cols[None, :]
        g = tl.load(G_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        masked = tl.load(Mask_ptr + rows, mask=n_ok, other=0) != 0
        if WRITE_GX:
            gx = tl.where(masked[:, None], 0.0, g)
            tl.store(GX_ptr + offs, gx.to(GX_ptr.dtype.element_ty), mask=ok)
        acc_s += g
        acc_e += tl.where(masked[:, None], g, 0.0)
    tl.store(S_ptr + n[:, None] * D + cols[None, :], acc_s, mask=ok)
    tl.store(E_ptr + pid_m * D + cols, tl.sum(acc_e, axis=0), mask=col_ok)


def _check_device(x: torch.Tensor) -> None:
    if x.device.type != "cuda" and not INTERPRETED:
        raise ValueError(
            f"the Triton masking kernel needs CUDA tensors, got {x.device} (set TRITON_INTERPRET=1 "
            "before importing procap.kernels.masking_triton to run it on CPU)"
        )


def masking_fwd(
    x: torch.Tensor,
    scheme: torch.Tensor,
    patch_prob: torch.Tensor,
    uniform: torch.Tensor,
    block: torch.Tensor,
    mask_embedding: torch.Tensor,
    pos_frame: torch.Tensor,
    pos_row: torch.Tensor,
    pos_col: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel.

    Args:
        x: (B, N, D) with N = T*H*W; scheme (B,), patch_prob (B,), uniform (B, N), block (B, 4) as in ``MaskParams``.
        mask_embedding: (D,); pos_frame, pos_row, pos_col: (T, D), (H, D), (W, D).

    Returns:
        ``(out, mask)``: (B, N, D) in ``x.dtype`` and the (B, N) bool mask.
    """
    _check_device(x)
    batch, n_pos, dim = x.shape
    frames, grid_h, grid_w = pos_frame.shape[0], pos_row.shape[0], pos_col.shape[0]
    if n_pos != frames * grid_h * grid_w:
        raise ValueError(f"x has {n_pos} positions, expected T*H*W = {frames * grid_h * grid_w}")
    x = x.contiguous()
    uniform = uniform.float().contiguous()
    out = torch.empty_like(x)
    mask = torch.empty(batch, n_pos, dtype=torch.uint8, device=x.device)
    n_rows = batch * n_pos
    block_m = BLOCK_M
    block_d = min(triton.next_power_of_2(dim), 128)
    grid = (triton.cdiv(n_rows, block_m), triton.cdiv(dim, block_d))
    _masking_fwd_kernel[grid](
        x,
        out,
        mask,
        scheme.contiguous(),
        patch_prob.float().contiguous(),
        uniform,
        block.contiguous(),
        mask_embedding.contiguous(),
        pos_frame.contiguous(),
        pos_row.contiguous(),
        pos_col.contiguous(),
        n_rows,
        n_pos,
        dim,
        grid_h,
        grid_w,
        uniform.stride(0),
        ROUND_BF16=INTERPRETED and x.dtype == torch.bfloat16,
        BLOCK_M=block_m,
        BLOCK_D=block_d,
        num_warps=4,
    )
    return out, mask.view(torch.bool)


def masking_bwd(
    grad: torch.Tensor, mask: torch.Tensor, num_frames: int, grid_h: int, grid_w: int, need_grad_x: bool = True
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward kernel.

    Args:
        grad: (B, N, D) gradient of ``out``.
        mask: (B, N) bool mask saved by the forward.

    Returns:
        ``(grad_x, grad_e_m, grad_pos_frame, grad_pos_row, grad_pos_col)``; grad_x (B, N, D) in ``grad.dtype``
        (None unless ``need_grad_x``), the others fp32 of shapes (D,), (T, D), (H, D), (W, D).
    """
    _check_device(grad)
    batch, n_pos, dim = grad.shape
    grad = grad.contiguous()
    block_m = BLOCK_M
    block_d = min(triton.next_power_of_2(dim), 128)
    grid = (triton.cdiv(n_pos, block_m), triton.cdiv(dim, block_d))
    grad_x = torch.empty_like(grad) if need_grad_x else grad  # dummy pointer when not written
    per_pos = torch.empty(n_pos, dim, dtype=torch.float32, device=grad.device)  # (N, D) sum over the batch
    per_tile = torch.empty(grid[0], dim, dtype=torch.float32, device=grad.device)  # masked sums per n-tile
    _masking_bwd_kernel[grid](
        grad,
        mask.contiguous().view(torch.uint8),
        grad_x,
        per_pos,
        per_tile,
        batch,
        n_pos,
        dim,
        WRITE_GX=need_grad_x,
        BLOCK_M=block_m,
        BLOCK_D=block_d,
        num_warps=4,
    )
    grid4 = per_pos.view(num_frames, grid_h, grid_w, dim)
    return (grad_x if need_grad_x else None, per_tile.sum(0), grid4.sum((1, 2)), grid4.sum((0, 2)), grid4.sum((0, 1)))


class MaskingFunction(torch.autograd.Function):
    """Autograd wrapper: differentiable in x, e_m and the three positional tables; the draws are constants."""

    @staticmethod
    def forward(ctx, x, scheme, patch_prob, uniform, block, mask_embedding, pos_frame, pos_row, pos_col):
        out, mask = masking_fwd(x, scheme, patch_prob, uniform, block, mask_embedding, pos_frame, pos_row, pos_col)
        ctx.save_for_backward(mask)
        ctx.geometry = (pos_frame.shape[0], pos_row.shape[0], pos_col.shape[0])
        ctx.dtypes = (x.dtype, mask_embedding.dtype, pos_frame.dtype, pos_row.dtype, pos_col.dtype)
        ctx.mark_non_differentiable(mask)
        return out, mask

    @staticmethod
    def backward(ctx, grad_out, _grad_mask):
        (mask,) = ctx.saved_tensors
        grad_x, grad_em, grad_pf, grad_pr, grad_pc = masking_bwd(
            grad_out, mask, *ctx.geometry, need_grad_x=ctx.needs_input_grad[0]
        )
        x_dtype, em_dtype, pf_dtype, pr_dtype, pc_dtype = ctx.dtypes
        grad_x = grad_x.to(x_dtype) if grad_x is not None else None
        return (
            grad_x,
            None,
            None,
            None,
            None,
            grad_em.to(em_dtype),
            grad_pf.to(pf_dtype),
            grad_pr.to(pr_dtype),
            grad_pc.to(pc_dtype),
        )


def masking_triton(
    x: torch.Tensor,
    params: MaskParams,
    mask_embedding: torch.Tensor,
    pos_frame: torch.Tensor,
    pos_row: torch.Tensor,
    pos_col: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`procap.model.masking.masking_ref` (same arguments, same outputs)."""
    return MaskingFunction.apply(
        x, params.scheme, params.patch_prob, params.uniform, params.block, mask_embedding, pos_frame, pos_row, pos_col
    )
