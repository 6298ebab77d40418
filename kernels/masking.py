"""Multi-granularity masking with axial positional embeddings (paper Appendix C): the whole fused op in one file.

Contract. The procedure sequence holds T = k + 2 frames of H x W visual tokens, flattened frame-major and row-major
(N = T * H * W). Per sample one scheme is drawn (:data:`ENTIRE`, :data:`RANDOM_PATCH`, :data:`IN_BLOCK`,
:data:`OUT_OF_BLOCK`, in ``procap.core.config.MASKING_SCHEMES`` order); all randomness is drawn up front into
:class:`MaskParams` (``procap.model.masking.sample_mask_params``), so every implementation computes the same mask::

    out[b, n] = where(mask[b, n], e_m, x[b, n]) + ((pos_frame[t] + pos_row[h]) + pos_col[w])      (fp32, cast to x)

Three implementations behind :func:`masking` (``procap.kernels.dispatch``):

- :func:`masking_ref`, the plain PyTorch reference (the truth);
- Triton: ``_masking_fwd_kernel`` / ``_masking_bwd_kernel``, their launchers :func:`masking_fwd` /
  :func:`masking_bwd` and :class:`MaskingFunction`. The forward rebuilds the mask bit from the draws with the
  reference's comparisons and adds in the reference's order, so it is bit-identical for fp32/fp16/bf16. The
  backward makes one pass over the incoming gradient: ``grad_x = grad * ~mask`` and per position ``n`` the fp32 sums
  ``S[n] = sum_b grad[b, n]`` and ``E[tile] = sum over masked rows``; the table gradients are sums of ``S`` over the
  other two axes and ``grad_e_m = E.sum(0)``. No atomics: gradients are deterministic.
- compiled: ``torch.ops.procap.masking_fwd`` / ``masking_bwd`` from ``csrc/masking_cpu.cpp`` (its scheme constants
  must equal the ones here; ``tests/kernels/test_masking.py`` compares every scheme with the reference), with the
  fake kernels and autograd registered below.

Both non-reference implementations share one backward (:func:`_masking_backward`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from procap.core.config import MASKING_SCHEMES
from procap.kernels import _ext
from procap.kernels._common import round_to_bf16_rne
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

ENTIRE, RANDOM_PATCH, IN_BLOCK, OUT_OF_BLOCK = range(len(MASKING_SCHEMES))
# The kernels' copies: compiled Triton reads only constexpr globals (plain ints fail at the first CUDA launch, while
# the interpreter accepts them; tests/kernels/test_compile_sm90.py compiles the kernels to catch this).
_RANDOM_PATCH_K, _IN_BLOCK_K, _OUT_OF_BLOCK_K = (triton_constexpr(v) for v in (RANDOM_PATCH, IN_BLOCK, OUT_OF_BLOCK))
# Rows per program. The interpreter's cost is per program (numpy works on whole tiles), so it gets larger tiles.
BLOCK_M = 128 if INTERPRETED else 16


# ----------------------------------------------------------------------------------------------- contract, reference
@dataclass
class MaskParams:
    """Random draws that fully determine a batch of masks.

    Attributes:
        scheme: (B,) int64 index into ``MASKING_SCHEMES``.
        patch_prob: (B,) float32 masking probability for ``random_patch`` samples.
        uniform: (B, N) float32 draws in [0, 1); position n is masked under ``random_patch`` when
            ``uniform[b, n] < patch_prob[b]``.
        block: (B, 4) int64 rectangle ``(top, left, height, width)`` in grid cells, shared by all frames.
    """

    scheme: torch.Tensor
    patch_prob: torch.Tensor
    uniform: torch.Tensor
    block: torch.Tensor

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(scheme, patch_prob, uniform, block)``, the order of the compiled and Triton ops' arguments."""
        return self.scheme, self.patch_prob, self.uniform, self.block

    def to(self, device: torch.device | str) -> MaskParams:
        return MaskParams(*(t.to(device) for t in self.tensors()))


def _check_positions(x: torch.Tensor, pos_frame: torch.Tensor, pos_row: torch.Tensor, pos_col: torch.Tensor) -> None:
    expected = pos_frame.shape[0] * pos_row.shape[0] * pos_col.shape[0]
    if x.dim() != 3 or x.shape[1] != expected:
        raise ValueError(f"x has {x.shape[1] if x.dim() > 1 else 0} positions, expected T*H*W = {expected}")


def mask_from_params(params: MaskParams, num_frames: int, grid_h: int, grid_w: int) -> torch.Tensor:
    """The boolean mask (True = masked) of shape (B, T*H*W) that ``params`` describes."""
    device = params.uniform.device
    rows = torch.arange(grid_h, device=device).view(1, 1, grid_h, 1)
    cols = torch.arange(grid_w, device=device).view(1, 1, 1, grid_w)
    top, left, height, width = (params.block[:, i].view(-1, 1, 1, 1) for i in range(4))
    inside = (rows >= top) & (rows < top + height) & (cols >= left) & (cols < left + width)  # (B, 1, H, W)
    inside = inside.expand(-1, num_frames, -1, -1).reshape(params.block.shape[0], -1)
    scheme = params.scheme.view(-1, 1)
    random_patch = params.uniform < params.patch_prob.view(-1, 1)
    mask = torch.where(scheme == RANDOM_PATCH, random_patch, torch.ones_like(random_patch))
    mask = torch.where(scheme == IN_BLOCK, inside, mask)
    mask = torch.where(scheme == OUT_OF_BLOCK, ~inside, mask)
    return mask


def axial_positions(pos_frame: torch.Tensor, pos_row: torch.Tensor, pos_col: torch.Tensor) -> torch.Tensor:
    """Sum of learned per-frame, per-row and per-column vectors: (T, D), (H, D), (W, D) -> (T*H*W, D)."""
    pos = pos_frame[:, None, None, :] + pos_row[None, :, None, :] + pos_col[None, None, :, :]
    return pos.reshape(-1, pos.shape[-1])


def masking_ref(
    x: torch.Tensor,
    params: MaskParams,
    mask_embedding: torch.Tensor,
    pos_frame: torch.Tensor,
    pos_row: torch.Tensor,
    pos_col: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference multi-granularity masking with axial positional embeddings.

    Args:
        x: (B, N, D) visual embeddings, N = T*H*W.
        params: draws from ``procap.model.masking.sample_mask_params``.
        mask_embedding: (D,) the learnable e_m that replaces masked positions.
        pos_frame, pos_row, pos_col: (T, D), (H, D), (W, D) axial positional tables.

    Returns:
        ``(out, mask)``: (B, N, D) in ``x.dtype`` with ``out = where(mask, e_m, x) + pos`` computed in fp32,
        and the (B, N) bool mask.
    """
    _check_positions(x, pos_frame, pos_row, pos_col)
    num_frames, grid_h, grid_w = pos_frame.shape[0], pos_row.shape[0], pos_col.shape[0]
    mask = mask_from_params(params, num_frames, grid_h, grid_w)
    pos = axial_positions(pos_frame.float(), pos_row.float(), pos_col.float())
    out = torch.where(mask.unsqueeze(-1), mask_embedding.float(), x.float()) + pos
    return out.to(x.dtype), mask


# ----------------------------------------------------------------------------------------------- Triton
@triton_jit
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
    entire = (scheme != _RANDOM_PATCH_K) & (scheme != _IN_BLOCK_K) & (scheme != _OUT_OF_BLOCK_K)
    masked = entire | ((scheme == _RANDOM_PATCH_K) & (u < prob))
    masked = masked | ((scheme == _IN_BLOCK_K) & inside) | ((scheme == _OUT_OF_BLOCK_K) & (inside == 0))
    return masked


@triton_jit
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
        out = round_to_bf16_rne(out)
    tl.store(Out_ptr + offs, out.to(Out_ptr.dtype.element_ty), mask=ok)
    if pid_d == 0:  # one column tile writes the mask
        tl.store(Mask_ptr + rows, masked.to(tl.int8), mask=row_ok)


@triton_jit
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
    require_triton_tensor(x, "masking kernel")
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
    require_triton_tensor(grad, "masking kernel")
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


# ----------------------------------------------------------------------------------------------- autograd
def _masking_setup(ctx, inputs: tuple, mask: torch.Tensor) -> None:
    """Save what the shared backward needs: the (B, N) mask, the grid and the input dtypes."""
    x, _, _, _, _, mask_embedding, pos_frame, pos_row, pos_col = inputs
    ctx.save_for_backward(mask)
    ctx.geometry = (pos_frame.shape[0], pos_row.shape[0], pos_col.shape[0])
    ctx.dtypes = (x.dtype, mask_embedding.dtype, pos_frame.dtype, pos_row.dtype, pos_col.dtype)


def _masking_backward(ctx, grad_out: torch.Tensor, backward_launcher) -> tuple:
    """Gradients of (x, 4 draws, e_m, pos_frame, pos_row, pos_col) from ``backward_launcher``'s fp32 sums."""
    (mask,) = ctx.saved_tensors
    need_x = ctx.needs_input_grad[0]
    grads = backward_launcher(grad_out.contiguous(), mask, *ctx.geometry, need_x)
    grad_x = grads[0].to(ctx.dtypes[0]) if need_x else None
    em, pf, pr, pc = (g.to(dtype) for g, dtype in zip(grads[1:], ctx.dtypes[1:]))
    return grad_x, None, None, None, None, em, pf, pr, pc


class MaskingFunction(torch.autograd.Function):
    """Triton masking as an autograd op: differentiable in x, e_m and the three tables; the draws are constants."""

    @staticmethod
    def forward(ctx, x, scheme, patch_prob, uniform, block, mask_embedding, pos_frame, pos_row, pos_col):
        inputs = (x, scheme, patch_prob, uniform, block, mask_embedding, pos_frame, pos_row, pos_col)
        out, mask = masking_fwd(*inputs)
        _masking_setup(ctx, inputs, mask)
        ctx.mark_non_differentiable(mask)
        return out, mask

    @staticmethod
    def backward(ctx, grad_out, _grad_mask):
        return _masking_backward(ctx, grad_out, masking_bwd)


def masking_triton(
    x: torch.Tensor,
    params: MaskParams,
    mask_embedding: torch.Tensor,
    pos_frame: torch.Tensor,
    pos_row: torch.Tensor,
    pos_col: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`masking_ref` (same arguments, same outputs)."""
    return MaskingFunction.apply(x, *params.tensors(), mask_embedding, pos_frame, pos_row, pos_col)


# ----------------------------------------------------------------------------------------------- compiled op
def _register_compiled() -> None:
    """Fake (meta) kernels so the compiled ops trace under torch.compile, and autograd for ``masking_fwd``."""

    @torch.library.register_fake("procap::masking_fwd")
    def _masking_fwd_fake(x, scheme, patch_prob, uniform, block, mask_embedding, pos_frame, pos_row, pos_col):
        return torch.empty_like(x), x.new_empty(x.shape[:2], dtype=torch.bool)

    @torch.library.register_fake("procap::masking_bwd")
    def _masking_bwd_fake(grad, mask, num_frames, grid_h, grid_w, need_grad_x):
        dim = grad.shape[-1]
        grad_x = torch.empty_like(grad) if need_grad_x else grad.new_empty(0)
        f32 = {"dtype": torch.float32}
        tables = (grad.new_empty(n, dim, **f32) for n in (num_frames, grid_h, grid_w))
        return (grad_x, grad.new_empty(dim, **f32), *tables)

    torch.library.register_autograd(
        "procap::masking_fwd",
        lambda ctx, grad_out, _grad_mask: _masking_backward(ctx, grad_out, torch.ops.procap.masking_bwd),
        setup_context=lambda ctx, inputs, output: _masking_setup(ctx, inputs, output[1]),
    )


_ext.on_load(_register_compiled)  # the ops exist once the library is loaded (compiled on first use)


def masking_compiled(
    x: torch.Tensor,
    params: MaskParams,
    mask_embedding: torch.Tensor,
    pos_frame: torch.Tensor,
    pos_row: torch.Tensor,
    pos_col: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Compiled version of :func:`masking_ref` (same arguments, same outputs)."""
    return torch.ops.procap.masking_fwd(x, *params.tensors(), mask_embedding, pos_frame, pos_row, pos_col)


# ----------------------------------------------------------------------------------------------- dispatch
MASKING = register(FusedOp("masking", masking_ref, masking_triton, masking_compiled, compiled_name="masking_fwd"))


def masking(
    x: torch.Tensor,
    params: MaskParams,
    mask_embedding: torch.Tensor,
    pos_frame: torch.Tensor,
    pos_row: torch.Tensor,
    pos_col: torch.Tensor,
    impl: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked visual embeddings plus axial positions, through the fastest implementation (see :func:`masking_ref`).

    Args:
        x: (B, N, D) visual embeddings, N = T*H*W; fp32/fp16/bf16 take the fused kernels.
        params: draws from ``procap.model.masking.sample_mask_params`` on ``x.device``.
        mask_embedding: (D,) e_m; pos_frame, pos_row, pos_col: (T, D), (H, D), (W, D).
        impl: None (automatic) or one of ``procap.kernels.IMPLS``.

    Returns:
        ``(out, mask)``: (B, N, D) in ``x.dtype`` and the (B, N) bool mask; differentiable in x, e_m and the tables.
    """
    _check_positions(x, pos_frame, pos_row, pos_col)
    tensors = (x, mask_embedding, pos_frame, pos_row, pos_col)
    requires_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    return run("masking", impl, x, requires_grad, x, params, mask_embedding, pos_frame, pos_row, pos_col)
