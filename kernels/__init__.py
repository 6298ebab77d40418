"""Fused ops (imported as ``procap.kernels``): one dispatch point per op.

``masking(...)`` and ``vq_nearest(...)`` pick the fastest implementation available for the inputs'
device and dtype; ``impl=`` overrides the choice for tests and benchmarks. The PyTorch references live in
``procap.model.masking`` and ``procap.model.quantize``.
"""

from __future__ import annotations

import torch

from procap.model.masking import MaskParams, masking_ref
from procap.model.quantize import vq_nearest_ref


def masking(x: torch.Tensor, params: MaskParams, mask_embedding: torch.Tensor, pos_frame: torch.Tensor,
            pos_row: torch.Tensor, pos_col: torch.Tensor, impl: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked visual embeddings plus axial positions; see :func:`procap.model.masking.masking_ref`."""
    return masking_ref(x, params, mask_embedding, pos_frame, pos_row, pos_col)


def vq_nearest(z: torch.Tensor, codebook: torch.Tensor, return_quantized: bool = False, impl: str | None = None):
    """Nearest codebook indices; see :func:`procap.model.quantize.vq_nearest_ref`."""
    return vq_nearest_ref(z, codebook, return_quantized)
