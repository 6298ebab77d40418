"""Loader for the compiled ops (``procap.kernels._C``, built from csrc/ by setup.py).

Importing the shared library registers the ``torch.ops.procap`` schemas (csrc/module.cpp) and their C++ / CUDA
kernels; each op's file (``masking.py``, ``vq.py``) adds its Python parts (fake kernels, autograd). When the
extension is missing, :data:`AVAILABLE` is False and :data:`LOAD_ERROR` says why; nothing raises.
"""

from __future__ import annotations

import importlib

import torch

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
