"""Per-channel bias add with an optional residual, in one pass: ``out = (x + bias[c]) + residual``.

A cuDNN convolution with a bias runs the convolution without it and then a separate broadcast ``add_`` of the
(1, C, 1, 1) bias; that operand has zero strides, so ATen takes its non-vectorised elementwise kernel (on the H100
profile 36 such passes cost about 9 ms per batch-32 VQGAN forward, docs/gpu.md). The fast VQGAN encoder
(``procap.model.vqgan_fused``) runs its convolutions bias-free and adds each bias where the tensor is read anyway; where
nothing reads it (a residual block's output, the encoder's last convolution) this op adds bias and shortcut in the
pass that the residual add needed anyway: read two tensors, write one.

The two adds are rounded to the storage dtype one after the other, exactly as the reference's two eager adds, so
the output equals :func:`bias_add_ref` bit for bit in fp32, fp16 and bf16. Forward only (inference): with an input
that requires grad the dispatch runs the reference.
"""

from __future__ import annotations

import torch

from procap.kernels._common import as_stored, memory_layout, row_strides
from procap.kernels.dispatch import INTERPRETED, FusedOp, register, require_triton_tensor, run, tl, triton, triton_jit

BLOCK_C_MAX = 128
TILE_ELEMENTS = 16384 if INTERPRETED else 4096


def bias_add_ref(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """Reference: ``(x + bias.view(1, C, 1, 1)) + residual`` in x's dtype (the eager model's two adds).

    Args:
        x: (B, C, H, W) activations (a bias-free convolution's output).
        bias: (C,) the convolution's bias, cast to x's dtype first.
        residual: optional tensor like x (the block's shortcut).

    Returns:
        (B, C, H, W) in x's dtype.
    """
    out = x + bias.to(x.dtype).view(1, -1, 1, 1)
    return out if residual is None else out + residual


@triton_jit
def _bias_add_kernel(
    X_ptr,
    Bias_ptr,
    R_ptr,
    Out_ptr,
    HW,
    C,
    stride_b,
    stride_hw,
    stride_c,
    HAS_RESIDUAL: tl.constexpr,
    ROUND_BF16: tl.constexpr,
    BLOCK_HW: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """out = (x + bias[c]) (+ r) on a (BLOCK_HW rows, BLOCK_C channels) tile of one sample."""
    pid_b = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_HW + tl.arange(0, BLOCK_HW)
    cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < C
    ok = (rows < HW)[:, None] & col_ok[None, :]
    offs = pid_b.to(tl.int64) * stride_b + rows.to(tl.int64)[:, None] * stride_hw + cols[None, :] * stride_c
    bias = tl.load(Bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    out = as_stored(tl.load(X_ptr + offs, mask=ok, other=0.0).to(tl.float32) + bias[None, :], X_ptr, ROUND_BF16)
    if HAS_RESIDUAL:
        out = as_stored(out + tl.load(R_ptr + offs, mask=ok, other=0.0).to(tl.float32), X_ptr, ROUND_BF16)
    tl.store(Out_ptr + offs, out.to(Out_ptr.dtype.element_ty), mask=ok)


def bias_add_triton(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """Triton version of :func:`bias_add_ref`; the output keeps x's layout (channels-last or NCHW)."""
    if x.dim() != 4 or bias.shape != (x.shape[1],):
        raise ValueError(f"bias_add takes (B, C, H, W) and (C,), got {tuple(x.shape)} and {tuple(bias.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} differs from x {tuple(x.shape)} {x.dtype}")
    require_triton_tensor(x, "bias add")
    layout = memory_layout(x)
    x = x.contiguous(memory_format=layout)
    r = x if residual is None else residual.contiguous(memory_format=layout)
    out = torch.empty_like(x)
    batch, channels, height, width = x.shape
    hw = height * width
    block_c = min(triton.next_power_of_2(channels), BLOCK_C_MAX)
    block_hw = max(16, TILE_ELEMENTS // block_c)
    _bias_add_kernel[(batch, triton.cdiv(hw, block_hw), triton.cdiv(channels, block_c))](
        x,
        bias.to(x.dtype).contiguous(),
        r,
        out,
        hw,
        channels,
        *row_strides(x),
        HAS_RESIDUAL=residual is not None,
        ROUND_BF16=INTERPRETED and x.dtype == torch.bfloat16,
        BLOCK_HW=block_hw,
        BLOCK_C=block_c,
        num_warps=4,
    )
    return out


# ----------------------------------------------------------------------------------------------- dispatch
BIAS_ADD = register(FusedOp("bias_add", bias_add_ref, bias_add_triton, differentiable=False))


def bias_add(
    x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor | None = None, impl: str | None = None
) -> torch.Tensor:
    """``(x + bias[c]) + residual`` in one pass on CUDA (Triton), the reference elsewhere and under compilation.

    Args:
        x: (B, C, H, W); bias: (C,); residual: optional tensor like x.
        impl: None (automatic) or ``"reference"`` / ``"triton"``.
    """
    if torch.compiler.is_compiling() or (impl is None and x.dim() != 4):
        return bias_add_ref(x, bias, residual)
    requires_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, bias, residual) if t is not None)
    return run("bias_add", impl, x, requires_grad, x, bias, residual)
