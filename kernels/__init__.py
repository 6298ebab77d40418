"""Fused ops (imported as ``procap.kernels``): one dispatch point per op.

``masking(...)`` and ``vq_nearest(...)`` pick an implementation once per (op, device type, dtype, requires grad)
and remember it (:func:`chosen_impl` tells which):

* CUDA tensors: the Triton kernel (``masking_triton.py``, ``vq_triton.py``); the compiled CUDA op from csrc/ is
  used only when asked for (``impl="cuda"``) until a GPU benchmark shows it ahead of Triton;
* CPU tensors: the compiled C++ op (``procap.kernels._C``) when the extension is built;
* anything else, or when the preferred one is missing: the PyTorch reference, with one warning per op and device.

``impl=`` ("reference", "triton", "cpp", "cuda") overrides the choice for tests and benchmarks and raises if that
implementation cannot run the inputs. ``PROCAP_KERNELS=reference`` forces the references everywhere
(``PROCAP_KERNELS=triton|cpp|cuda`` prefers that one where it can run). The references live in
``procap.model.masking`` and ``procap.model.quantize``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import warnings
from types import ModuleType

import torch

from procap.model.masking import MaskParams, masking_ref
from procap.model.quantize import vq_nearest_ref

IMPLS = ("reference", "triton", "cpp", "cuda")
_FAST_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Compiled CUDA ops the automatic choice prefers over Triton; empty until measured on a GPU (docs/kernels.md).
_PREFER_CUDA_EXT: frozenset[str] = frozenset()
_EXT_OPS = {"masking": "masking_fwd", "vq_nearest": "vq_nearest"}  # dispatch name -> torch.ops.procap name
_warned: set[tuple[str, str]] = set()


def _compiled() -> ModuleType:
    # Imported on first use: loading the shared library costs time and most imports of procap never need it.
    return importlib.import_module("procap.kernels._ext")


def _triton_module(op: str) -> ModuleType:
    # Lazy as well: triton reads TRITON_INTERPRET when the kernels are decorated, i.e. at this import.
    return importlib.import_module("procap.kernels.masking_triton" if op == "masking" else "procap.kernels.vq_triton")


def _why_not(op: str, impl: str, device_type: str, dtype: torch.dtype) -> str | None:
    """None if ``impl`` can run ``op`` on these inputs, else the reason in a few words."""
    if impl == "reference":
        return None
    if dtype not in _FAST_DTYPES:
        return f"{dtype} is not one of the fused dtypes (fp32, fp16, bf16)"
    if impl == "triton":
        if importlib.util.find_spec("triton") is None:
            return "triton is not installed"
        if device_type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
            return "Triton kernels need CUDA tensors (or TRITON_INTERPRET=1)"
        return None
    want = "cpu" if impl == "cpp" else "cuda"
    if device_type != want:
        return f"impl={impl!r} runs on {want} tensors, got {device_type}"
    if not _compiled().has_kernel(_EXT_OPS[op], want):
        error = _compiled().LOAD_ERROR
        return f"the compiled extension has no {want} kernel for {op}" + (f" ({error})" if error else "")
    return None


def _preference(op: str, device_type: str) -> list[str]:
    forced = os.environ.get("PROCAP_KERNELS", "").strip().lower()
    if forced == "reference":
        return ["reference"]
    if device_type == "cuda":
        order = ["cuda", "triton"] if op in _PREFER_CUDA_EXT else ["triton", "cuda"]
    elif device_type == "cpu":
        order = ["cpp"]
    else:
        order = []
    if forced in IMPLS:
        order = [forced] + [impl for impl in order if impl != forced]
    return order + ["reference"]


@functools.cache
def _choose(op: str, device_type: str, dtype: torch.dtype, requires_grad: bool) -> str:
    """The implementation for this key; decided once (clear with ``_choose.cache_clear()``)."""
    # Every implementation has a backward for masking, so requires_grad does not change the order today; it is
    # part of the key so a forward-only kernel could be added without touching the callers.
    reasons = []
    for impl in _preference(op, device_type):
        reason = _why_not(op, impl, device_type, dtype)
        if reason is None:
            if impl == "reference" and reasons and (op, device_type) not in _warned:
                _warned.add((op, device_type))
                warnings.warn(
                    f"procap.kernels.{op}: falling back to the PyTorch reference on {device_type} "
                    f"({'; '.join(reasons)})",
                    RuntimeWarning,
                    stacklevel=4,
                )
            return impl
        reasons.append(f"{impl}: {reason}")
    raise AssertionError("unreachable: the reference always runs")


def _resolve(op: str, impl: str | None, device: torch.device, dtype: torch.dtype, requires_grad: bool) -> str:
    if impl is None:
        return _choose(op, device.type, dtype, requires_grad)
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS} or None, got {impl!r}")
    reason = _why_not(op, impl, device.type, dtype)
    if reason is not None:
        raise ValueError(f"procap.kernels.{op}: impl={impl!r} cannot run here: {reason}")
    return impl


def reset_dispatch() -> None:
    """Forget the remembered choices and warnings (after changing ``PROCAP_KERNELS``, in tests)."""
    _choose.cache_clear()
    _warned.clear()


def chosen_impl(op: str, device: torch.device | str, dtype: torch.dtype, requires_grad: bool = False) -> str:
    """Which implementation ``masking``/``vq_nearest`` use for such inputs (for logs and benchmarks)."""
    return _choose(op, torch.device(device).type, dtype, requires_grad)


def masking(
    x: torch.Tensor,
    params: MaskParams,
    mask_embedding: torch.Tensor,
    pos_frame: torch.Tensor,
    pos_row: torch.Tensor,
    pos_col: torch.Tensor,
    impl: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked visual embeddings plus axial positions; see :func:`procap.model.masking.masking_ref`.

    Args:
        x: (B, N, D) visual embeddings, N = T*H*W; fp32/fp16/bf16.
        params: draws from :func:`procap.model.masking.sample_mask_params` on ``x.device``.
        mask_embedding: (D,) e_m; pos_frame, pos_row, pos_col: (T, D), (H, D), (W, D).
        impl: None (automatic) or one of :data:`IMPLS`.

    Returns:
        ``(out, mask)``: (B, N, D) in ``x.dtype`` and the (B, N) bool mask; differentiable in x, e_m and the tables.
    """
    tensors = (x, mask_embedding, pos_frame, pos_row, pos_col)
    requires_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    chosen = _resolve("masking", impl, x.device, x.dtype, requires_grad)
    if chosen == "reference":
        return masking_ref(x, params, mask_embedding, pos_frame, pos_row, pos_col)
    if x.shape[1] != pos_frame.shape[0] * pos_row.shape[0] * pos_col.shape[0]:  # same message as the reference
        raise ValueError(
            f"x has {x.shape[1]} positions, expected T*H*W = {pos_frame.shape[0] * pos_row.shape[0] * pos_col.shape[0]}"
        )
    if chosen == "triton":
        return _triton_module("masking").masking_triton(x, params, mask_embedding, pos_frame, pos_row, pos_col)
    return _compiled().masking_ext(x, params, mask_embedding, pos_frame, pos_row, pos_col)


def vq_nearest(
    z: torch.Tensor, codebook: torch.Tensor, return_quantized: bool = False, impl: str | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Nearest codebook indices; see :func:`procap.model.quantize.vq_nearest_ref`.

    Args:
        z: (N, D) latents; codebook: (K, D); fp32/fp16/bf16.
        return_quantized: also return ``codebook[indices]`` (N, D).
        impl: None (automatic) or one of :data:`IMPLS`.

    Returns:
        (N,) int64 indices (ties: lowest index), or ``(indices, quantized)``.
    """
    if z.dim() != 2 or codebook.dim() != 2 or z.shape[1] != codebook.shape[1]:
        raise ValueError(f"expected z (N, D) and codebook (K, D), got {tuple(z.shape)} and {tuple(codebook.shape)}")
    if codebook.shape[0] == 0:
        raise ValueError("the codebook is empty (K = 0)")
    chosen = _resolve("vq_nearest", impl, z.device, z.dtype, False)
    if chosen == "reference":
        return vq_nearest_ref(z, codebook, return_quantized)
    if chosen == "triton":
        return _triton_module("vq_nearest").vq_nearest_triton(z, codebook, return_quantized)
    return _compiled().vq_nearest_ext(z, codebook, return_quantized)


__all__ = ["IMPLS", "chosen_impl", "masking", "reset_dispatch", "vq_nearest"]
