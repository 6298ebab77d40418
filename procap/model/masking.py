"""Multi-granularity masking for masked sequence modeling (paper Appendix C): the PyTorch reference.

The procedure sequence holds T = k + 2 frames of H x W visual tokens, flattened frame-major and row-major
(N = T * H * W). Per sample one scheme is drawn:

* ``entire``       every position is masked;
* ``random_patch`` each position is masked independently with probability p ~ U(0.2, 0.5);
* ``in_block``     positions inside one random rectangle are masked (the same rectangle in every frame);
* ``out_of_block`` positions outside that rectangle are masked.

All randomness is drawn up front into :class:`MaskParams` (on the device, no host synchronisation), so the
reference here and the fused kernels in ``procap.kernels`` compute exactly the same mask from the same draws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from procap.config import MASKING_SCHEMES, MaskingConfig

ENTIRE, RANDOM_PATCH, IN_BLOCK, OUT_OF_BLOCK = range(len(MASKING_SCHEMES))


@dataclass
class MaskParams:
    """Random draws that fully determine a batch of masks.

    Attributes:
        scheme: (B,) int64 index into ``MASKING_SCHEMES``.
        patch_prob: (B,) float32 masking probability for ``random_patch`` samples.
        uniform: (B, N) float32 draws in [0, 1); position n is masked under ``random_patch`` when
            ``uniform[b, n] < patch_prob[b]``.
        block: (B, 4) int64 rectangle ``(top, left, height, width)`` in grid cells, shared by all frames.
    """

    scheme: torch.Tensor
    patch_prob: torch.Tensor
    uniform: torch.Tensor
    block: torch.Tensor

    def to(self, device: torch.device | str) -> MaskParams:
        return MaskParams(*(t.to(device) for t in (self.scheme, self.patch_prob, self.uniform, self.block)))


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


def mask_from_params(params: MaskParams, num_frames: int, grid_h: int, grid_w: int) -> torch.Tensor:
    """The boolean mask (True = masked) of shape (B, T*H*W) that ``params`` describes."""
    device = params.uniform.device
    rows = torch.arange(grid_h, device=device).view(1, 1, grid_h, 1)
    cols = torch.arange(grid_w, device=device).view(1, 1, 1, grid_w)
    top, left, height, width = (params.block[:, i].view(-1, 1, 1, 1) for i in range(4))
    inside = (rows >= top) & (rows < top + height) & (cols >= left) & (cols < left + width)  # (B, 1, H, W)
    inside = inside.expand(-1, num_frames, -1, -1).reshape(params.block.shape[0], -1)
    scheme = params.scheme.view(-1, 1)
    random_patch = params.uniform < params.patch_prob.view(-1, 1)
    mask = torch.where(scheme == RANDOM_PATCH, random_patch, torch.ones_like(random_patch))
    mask = torch.where(scheme == IN_BLOCK, inside, mask)
    mask = torch.where(scheme == OUT_OF_BLOCK, ~inside, mask)
    return mask


def axial_positions(pos_frame: torch.Tensor, pos_row: torch.Tensor, pos_col: torch.Tensor) -> torch.Tensor:
    """Sum of learned per-frame, per-row and per-column vectors: (T, D), (H, D), (W, D) -> (T*H*W, D)."""
    pos = pos_frame[:, None, None, :] + pos_row[None, :, None, :] + pos_col[None, None, :, :]
    return pos.reshape(-1, pos.shape[-1])


def masking_ref(
    x: torch.Tensor,
    params: MaskParams,
    mask_embedding: torch.Tensor,
    pos_frame: torch.Tensor,
    pos_row: torch.Tensor,
    pos_col: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference multi-granularity masking with axial positional embeddings.

    Args:
        x: (B, N, D) visual embeddings, N = T*H*W.
        params: draws from :func:`sample_mask_params`.
        mask_embedding: (D,) the learnable e_m that replaces masked positions.
        pos_frame, pos_row, pos_col: (T, D), (H, D), (W, D) axial positional tables.

    Returns:
        ``(out, mask)``: (B, N, D) in ``x.dtype`` with ``out = where(mask, e_m, x) + pos`` computed in fp32,
        and the (B, N) bool mask.
    """
    num_frames, grid_h, grid_w = pos_frame.shape[0], pos_row.shape[0], pos_col.shape[0]
    if x.shape[1] != num_frames * grid_h * grid_w:
        raise ValueError(f"x has {x.shape[1]} positions, expected T*H*W = {num_frames * grid_h * grid_w}")
    mask = mask_from_params(params, num_frames, grid_h, grid_w)
    pos = axial_positions(pos_frame.float(), pos_row.float(), pos_col.float())
    out = torch.where(mask.unsqueeze(-1), mask_embedding.float(), x.float()) + pos
    return out.to(x.dtype), mask
