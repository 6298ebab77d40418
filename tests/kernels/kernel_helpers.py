"""Helpers for the kernel tests: which implementations can run here, where their inputs live, error measures."""

from __future__ import annotations

import os

import pytest
import torch

from procap.kernels import _ext

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _triton_skip() -> str | None:
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return "no CUDA and TRITON_INTERPRET is not 1"
    return None


def _cpp_skip() -> str | None:
    if not _ext.AVAILABLE:
        return f"the C++ extension is not built ({_ext.LOAD_ERROR}); pip install -e . --no-build-isolation"
    return None


def _cuda_ext_skip(op: str) -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if not _ext.has_kernel(op, "cuda"):
        return f"the extension was built without a CUDA kernel for {op}"
    return None


def impl_params(ext_op: str, cuda_kernel: bool = True) -> list:
    """pytest params over the implementations of one op, each skipped with its reason when it cannot run.

    ``cuda_kernel=False``: csrc/cuda has no kernel for the op (Triton serves CUDA), so there is no "cuda" param to
    skip on a GPU machine.
    """
    skips = {"reference": None, "triton": _triton_skip(), "cpp": _cpp_skip()}
    if cuda_kernel:
        skips["cuda"] = _cuda_ext_skip(ext_op)
    return [
        pytest.param(impl, marks=pytest.mark.skipif(reason is not None, reason=reason or ""), id=impl)
        for impl, reason in skips.items()
    ]


def impl_device(impl: str) -> torch.device:
    """Where an implementation's inputs live: the Triton interpreter and the C++ op take CPU tensors."""
    if impl == "cuda" or (impl == "triton" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def max_abs_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
