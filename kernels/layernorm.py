"""Residual add + LayerNorm in one launch, for the decoding step: ``x += h; y = layer_norm(x)``.

A pre-LN decoder layer does ``x = x + sublayer(norm(x))`` three times, and each add is followed by the next norm
(or the final one). Eagerly that is an add and a LayerNorm kernel per sublayer; at decoding batch sizes both are
latency, not bandwidth. One program per row adds, normalises and writes both results. The add is rounded to x's
dtype before the statistics (as the eager add leaves it) and ``y`` is rounded to x's dtype before it is stored
(as the eager LayerNorm leaves it), also when the output buffer is fp32 (the fp32 logits read it).

Forward only (the decoding step runs under ``no_grad``): with an input that requires grad the dispatch runs the
reference. x is updated in place by every implementation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from procap.kernels._common import as_stored
from procap.kernels.dispatch import INTERPRETED, FusedOp, register, require_triton_tensor, run, tl, triton, triton_jit


def add_layer_norm_ref(
    x: torch.Tensor,
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Reference: ``x += h`` in place, then ``F.layer_norm`` over the last dim.

    Args:
        x: (..., D) the residual stream, updated in place; h: the sublayer output, same shape and dtype.
        weight, bias: (D,) the LayerNorm's affine parameters; eps: its epsilon.
        out_dtype: dtype of the returned tensor (its values are rounded to x's dtype first); None: x's dtype.

    Returns:
        ``layer_norm(x + h)`` as a new tensor.
    """
    x.add_(h)
    y = F.layer_norm(x, x.shape[-1:], weight, bias, eps)
    return y if out_dtype is None else y.to(out_dtype)


@triton_jit
def _add_layer_norm_kernel(
    X_ptr,
    H_ptr,
    W_ptr,
    B_ptr,
    Y_ptr,
    D,
    eps,
    ROUND_BF16: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One row: x = x + h (stored), y = (x - mean) * rstd * w + b."""
    row = tl.program_id(0).to(tl.int64) * D
    cols = tl.arange(0, BLOCK_D)
    ok = cols < D
    x = tl.load(X_ptr + row + cols, mask=ok, other=0.0).to(tl.float32)
    x = as_stored(x + tl.load(H_ptr + row + cols, mask=ok, other=0.0).to(tl.float32), X_ptr, ROUND_BF16)
    tl.store(X_ptr + row + cols, x.to(X_ptr.dtype.element_ty), mask=ok)
    mean = tl.sum(x, axis=0) / D
    centered = tl.where(ok, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt_rn(tl.sum(centered * centered, axis=0) / D + eps)
    w = tl.load(W_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    b = tl.load(B_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    y = as_stored(centered * rstd * w + b, X_ptr, ROUND_BF16)
    tl.store(Y_ptr + row + cols, y.to(Y_ptr.dtype.element_ty), mask=ok)


def add_layer_norm_triton(
    x: torch.Tensor,
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Triton version of :func:`add_layer_norm_ref` (x contiguous, updated in place)."""
    if h.shape != x.shape or h.dtype != x.dtype or weight.shape != x.shape[-1:] or bias.shape != x.shape[-1:]:
        raise ValueError(
            f"add_layer_norm: x {tuple(x.shape)} {x.dtype}, h {tuple(h.shape)} {h.dtype} and affine parameters "
            f"{tuple(weight.shape)} / {tuple(bias.shape)} do not fit together"
        )
    if not x.is_contiguous():
        raise ValueError("add_layer_norm updates x in place and needs it contiguous")
    require_triton_tensor(x, "add + LayerNorm")
    d = x.shape[-1]
    y = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device)
    block_d = triton.next_power_of_2(d)
    _add_layer_norm_kernel[(x.numel() // d,)](
        x,
        h.contiguous(),
        weight,
        bias,
        y,
        d,
        eps,
        ROUND_BF16=INTERPRETED and x.dtype == torch.bfloat16,
        BLOCK_D=block_d,
        num_warps=min(8, max(1, block_d // 256)),
    )
    return y


# ----------------------------------------------------------------------------------------------- dispatch
ADD_LAYER_NORM = register(FusedOp("add_layer_norm", add_layer_norm_ref, add_layer_norm_triton, differentiable=False))


def add_layer_norm(
    x: torch.Tensor,
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
    out_dtype: torch.dtype | None = None,
    impl: str | None = None,
) -> torch.Tensor:
    """``x += h`` (in place) and ``layer_norm(x)`` in one launch on CUDA (Triton); the reference elsewhere.

    Args:
        x: (..., D) contiguous residual stream, updated in place; h: like x.
        weight, bias: (D,); eps: the LayerNorm's epsilon.
        out_dtype: the returned tensor's dtype (values rounded to x's dtype first); None: x's dtype.
        impl: None (automatic) or ``"reference"`` / ``"triton"``.
    """
    if torch.compiler.is_compiling():
        return add_layer_norm_ref(x, h, weight, bias, eps, out_dtype)
    requires_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, h, weight, bias))
    return run("add_layer_norm", impl, x, requires_grad, x, h, weight, bias, eps, out_dtype)
