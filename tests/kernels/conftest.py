"""Kernel tests: Triton runs through its interpreter on CPU-only machines.

triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when ``procap.kernels`` is first imported, so it is
set here (and in the root conftest), before any test module of this folder imports it.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
