"""Mask sampling for masked sequence modeling (paper Appendix C): the random draws of :class:`MaskParams`.

Per sample one scheme is drawn (``entire``, ``random_patch`` with p ~ U(0.2, 0.5), ``in_block`` or ``out_of_block``
with one random rectangle shared by every frame). Everything is drawn up front on the device, without host
synchronisation; the mask itself (reference, Triton and compiled) is computed from these draws by
``procap.kernels.masking``, which owns the :class:`MaskParams` contract and the scheme constants.
"""

from __future__ import annotations

import math

import torch

from procap.core.config import MaskingConfig
from procap.kernels.masking import MaskParams


def sample_block(
    batch: int,
    grid_h: int,
    grid_w: int,
    config: MaskingConfig,
    device: torch.device | str,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Random rectangles with area ratio in ``block_area_range`` and aspect (h/w) in ``block_aspect_range``.

    Like torchvision's RandomErasing but without a rejection loop (it would need host syncs): the aspect is
    drawn log-uniformly, sides are rounded and clamped to the grid, the corner is uniform over valid positions.

    Returns:
        (B, 4) int64 ``(top, left, height, width)``.
    """
    draws = torch.rand(batch, 4, device=device, generator=generator)
    lo, hi = config.block_area_range
    area = (lo + (hi - lo) * draws[:, 0]) * (grid_h * grid_w)
    log_lo, log_hi = (math.log(a) for a in config.block_aspect_range)
    aspect = torch.exp(log_lo + (log_hi - log_lo) * draws[:, 1])
    height = torch.sqrt(area * aspect).round().clamp(1, grid_h)
    width = torch.sqrt(area / aspect).round().clamp(1, grid_w)
    top = torch.floor(draws[:, 2] * (grid_h - height + 1)).clamp(max=grid_h - height)
    left = torch.floor(draws[:, 3] * (grid_w - width + 1)).clamp(max=grid_w - width)
    return torch.stack([top, left, height, width], dim=1).long()


def sample_mask_params(
    batch: int,
    num_frames: int,
    grid_h: int,
    grid_w: int,
    config: MaskingConfig,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> MaskParams:
    """Draw the per-sample scheme, random-patch probabilities and draws, and block rectangles on ``device``."""
    probs = torch.tensor(config.scheme_probs, dtype=torch.float32, device=device)
    scheme = torch.multinomial(probs.expand(batch, -1), 1, generator=generator).squeeze(1)
    lo, hi = config.patch_prob_range
    patch_prob = lo + (hi - lo) * torch.rand(batch, device=device, generator=generator)
    uniform = torch.rand(batch, num_frames * grid_h * grid_w, device=device, generator=generator)
    block = sample_block(batch, grid_h, grid_w, config, device, generator)
    return MaskParams(scheme=scheme, patch_prob=patch_prob, uniform=uniform, block=block)
