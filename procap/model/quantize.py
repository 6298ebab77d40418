"""Vector-quantizer codebook lookup: the PyTorch reference.

taming-transformers' VectorQuantizer picks, for every latent vector z, the code e_j minimising
``||z||^2 + ||e_j||^2 - 2 z . e_j``; ties go to the lowest index (``torch.argmin``). The fused kernels in
``procap.kernels`` compute the same indices without materialising the N x K distance matrix.
"""

from __future__ import annotations

import torch


def vq_distances_ref(z: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """(N, D), (K, D) -> (N, K) squared distances in fp32, in taming's expansion order."""
    z32, e32 = z.float(), codebook.float()
    return (z32 * z32).sum(1, keepdim=True) + (e32 * e32).sum(1) - 2.0 * (z32 @ e32.t())


def vq_nearest_ref(
    z: torch.Tensor, codebook: torch.Tensor, return_quantized: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Nearest codebook entry for every row of ``z``.

    Args:
        z: (N, D) latent vectors, fp32/fp16/bf16.
        codebook: (K, D) code vectors.
        return_quantized: also return ``codebook[indices]`` (in ``codebook.dtype``).

    Returns:
        (N,) int64 indices, or ``(indices, quantized)`` with quantized (N, D).
    """
    if z.dim() != 2 or codebook.dim() != 2 or z.shape[1] != codebook.shape[1]:
        raise ValueError(f"expected z (N, D) and codebook (K, D), got {tuple(z.shape)} and {tuple(codebook.shape)}")
    indices = torch.argmin(vq_distances_ref(z, codebook), dim=1)
    if return_quantized:
        return indices, codebook[indices]
    return indices
