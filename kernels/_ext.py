"""Loader for the compiled ops (``procap.kernels._C``, built from csrc/ by setup.py) and their Python registrations.

Importing the shared library registers ``torch.ops.procap.masking_fwd``, ``masking_bwd`` and ``vq_nearest``
(C++ on CPU, CUDA when built with CUDA). This file adds what the C++ side does not: fake (meta) kernels so the ops
trace under ``torch.compile``/FakeTensor, and autograd for ``masking_fwd`` via ``torch.library.register_autograd``.
When the extension is missing, :data:`AVAILABLE` is False and :data:`LOAD_ERROR` says why; nothing raises.
"""

from __future__ import annotations

import importlib

import torch

from procap.model.masking import MaskParams

LOAD_ERROR: str | None = None
try:
    importlib.import_module("procap.kernels._C")
    AVAILABLE = True
except (ImportError, OSError) as exc:  # not built (PROCAP_SKIP_EXT=1, failed compile) or built for another torch
    AVAILABLE = False
    LOAD_ERROR = f"{type(exc).__name__}: {exc}"


def has_kernel(op: str, device_type: str) -> bool:
    """Whether ``torch.ops.procap.<op>`` has a kernel for ``device_type`` ("cpu" or "cuda")."""
    if not AVAILABLE:
        return False
    key = {"cpu": "CPU", "cuda": "CUDA"}.get(device_type)
    return key is not None and torch._C._dispatch_has_kernel_for_dispatch_key(f"procap::{op}", key)


def _register_python_parts() -> None:
    @torch.library.register_fake("procap::masking_fwd")
    def _masking_fwd_fake(x, scheme, patch_prob, uniform, block, mask_embedding, pos_frame, pos_row, pos_col):
        return torch.empty_like(x), x.new_empty(x.shape[:2], dtype=torch.bool)

    @torch.library.register_fake("procap::masking_bwd")
    def _masking_bwd_fake(grad, mask, num_frames, grid_h, grid_w, need_grad_x):
        dim = grad.shape[-1]
        grad_x = torch.empty_like(grad) if need_grad_x else grad.new_empty(0)
        f32 = {"dtype": torch.float32}
        return (
            grad_x,
            grad.new_empty(dim, **f32),
            grad.new_empty(num_frames, dim, **f32),
            grad.new_empty(grid_h, dim, **f32),
            grad.new_empty(grid_w, dim, **f32),
        )

    @torch.library.register_fake("procap::vq_nearest")
    def _vq_nearest_fake(z, codebook):
        return z.new_empty(z.shape[0], dtype=torch.int64)

    def _setup_context(ctx, inputs, output):
        x, _, _, _, _, mask_embedding, pos_frame, pos_row, pos_col = inputs
        ctx.save_for_backward(output[1])
        ctx.geometry = (pos_frame.shape[0], pos_row.shape[0], pos_col.shape[0])
        ctx.dtypes = (x.dtype, mask_embedding.dtype, pos_frame.dtype, pos_row.dtype, pos_col.dtype)

    def _backward(ctx, grad_out, _grad_mask):
        (mask,) = ctx.saved_tensors
        need_x = ctx.needs_input_grad[0]
        grads = torch.ops.procap.masking_bwd(grad_out.contiguous(), mask, *ctx.geometry, need_x)
        grad_x = grads[0].to(ctx.dtypes[0]) if need_x else None
        em, pf, pr, pc = (g.to(dt) for g, dt in zip(grads[1:], ctx.dtypes[1:]))
        return grad_x, None, None, None, None, em, pf, pr, pc

    torch.library.register_autograd("procap::masking_fwd", _backward, setup_context=_setup_context)


if AVAILABLE:
    _register_python_parts()


def masking_ext(
    x: torch.Tensor,
    params: MaskParams,
    mask_embedding: torch.Tensor,
    pos_frame: torch.Tensor,
    pos_row: torch.Tensor,
    pos_col: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Compiled version of :func:`procap.model.masking.masking_ref` (same arguments, same outputs)."""
    return torch.ops.procap.masking_fwd(
        x, params.scheme, params.patch_prob, params.uniform, params.block, mask_embedding, pos_frame, pos_row, pos_col
    )


def vq_nearest_ext(
    z: torch.Tensor, codebook: torch.Tensor, return_quantized: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Compiled version of :func:`procap.model.quantize.vq_nearest_ref` (same arguments, same outputs)."""
    indices = torch.ops.procap.vq_nearest(z.detach(), codebook.detach())  # indices carry no gradient
    if return_quantized:
        return indices, codebook.index_select(0, indices)
    return indices
