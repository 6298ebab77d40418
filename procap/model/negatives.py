"""Consistency negatives for stage 1: warped procedures the csy head must call inconsistent.

Per sample one warp of ``NEGATIVE_WARPS`` is drawn (probabilities ``config.negative_probs``, 0.25 each in the
paper), applied in pixel space to the frames (B, T, 3, S, S) in [0, 1]:

* ``batch_frame_swap`` one frame is replaced by a frame of another sample of the batch;
* ``frame_shuffle``    the frames are reordered by a random non-identity permutation;
* ``color_shift``      one RGB channel of one frame is shifted by delta, |delta| in [0.1, 0.5], then clamped;
* ``affine``           one frame gets a random rotation (+-30 deg), translation (+-0.1) and scale (1 +- 0.1),
                       reflection padding.

This mirrors the authors' ``warp()``; two small deviations keep every negative a real change: the colour shift
has a minimum magnitude of 0.1 (the authors draw U(-0.5, 0.5), which can be ~0) and always hits one channel
(the authors sometimes shift all three). With a batch of one, ``batch_frame_swap`` has no partner and falls back
to ``frame_shuffle``. Randomness comes from a CPU ``torch.Generator`` (the draws are a handful of scalars).
"""

from __future__ import annotations

import math
from typing import Literal, overload

import torch
import torch.nn.functional as F

from procap.core.config import NEGATIVE_WARPS

BATCH_FRAME_SWAP, FRAME_SHUFFLE, COLOR_SHIFT, AFFINE = range(len(NEGATIVE_WARPS))
MAX_ANGLE, MAX_TRANSLATE, MAX_SCALE = 30.0, 0.1, 0.1  # the affine warp's ranges (degrees, fraction, fraction)


def _uniform(lo: float, hi: float, generator: torch.Generator | None) -> float:
    return lo + (hi - lo) * torch.rand((), generator=generator).item()


def _randint(high: int, generator: torch.Generator | None) -> int:
    return int(torch.randint(high, (), generator=generator).item())


def _frame_shuffle(video: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, list[int]]:
    num_frames = video.shape[0]
    if num_frames < 2:
        raise ValueError("frame_shuffle needs at least two frames")
    identity = torch.arange(num_frames)
    while True:  # rejection sampling: at most T!/(T!-1) tries on average
        perm = torch.randperm(num_frames, generator=generator)
        if not torch.equal(perm, identity):
            return video[perm.to(video.device)], (perm != identity).nonzero().flatten().tolist()


def frame_shuffle(video: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Reorder the frames of one video (T, 3, S, S) by a uniformly drawn non-identity permutation (T >= 2)."""
    return _frame_shuffle(video, generator)[0]


def _batch_frame_swap(
    frames: torch.Tensor, index: int, generator: torch.Generator | None
) -> tuple[torch.Tensor, list[int]]:
    batch, num_frames = frames.shape[:2]
    other = _randint(batch - 1, generator)
    other += other >= index  # uniform over the other B - 1 samples
    out = frames[index].clone()
    target = _randint(num_frames, generator)
    out[target] = frames[other, _randint(num_frames, generator)]
    return out, [target]


def batch_frame_swap(frames: torch.Tensor, index: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Sample ``index`` of ``frames`` (B, T, 3, S, S) with one frame taken from another sample (B >= 2)."""
    return _batch_frame_swap(frames, index, generator)[0]


def _color_shift(video: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, list[int]]:
    out = video.clone()
    frame, channel = _randint(video.shape[0], generator), _randint(3, generator)
    delta = _uniform(0.1, 0.5, generator) * (1.0 if torch.rand((), generator=generator) < 0.5 else -1.0)
    out[frame, channel] = (out[frame, channel] + delta).clamp(0.0, 1.0)
    return out, [frame]


def color_shift(video: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Shift one RGB channel of one frame of ``video`` (T, 3, S, S) by delta, 0.1 <= |delta| <= 0.5, clamp to [0, 1]."""
    return _color_shift(video, generator)[0]


def affine_matrix(angle_deg: float, translate: tuple[float, float], scale: float) -> torch.Tensor:
    """The (2, 3) ``affine_grid`` matrix of a rotation, scale and translation (normalised coordinates)."""
    a = math.radians(angle_deg)
    return torch.tensor(
        [
            [scale * math.cos(a), -scale * math.sin(a), translate[0]],
            [scale * math.sin(a), scale * math.cos(a), translate[1]],
        ],
        dtype=torch.float32,
    )


def random_affine(
    video: torch.Tensor,
    generator: torch.Generator | None = None,
    max_angle: float = MAX_ANGLE,
    max_translate: float = MAX_TRANSLATE,
    max_scale: float = MAX_SCALE,
) -> torch.Tensor:
    """Warp one frame of ``video`` (T, 3, S, S) by a random affine transform (reflection padding)."""
    return _random_affine(video, generator, max_angle, max_translate, max_scale)[0]


def _random_affine(
    video: torch.Tensor, generator: torch.Generator | None, max_angle: float, max_translate: float, max_scale: float
) -> tuple[torch.Tensor, list[int]]:
    out = video.clone()
    frame = _randint(video.shape[0], generator)
    theta = affine_matrix(
        _uniform(-max_angle, max_angle, generator),
        (_uniform(-max_translate, max_translate, generator), _uniform(-max_translate, max_translate, generator)),
        _uniform(1.0 - max_scale, 1.0 + max_scale, generator),
    )
    image = video[frame : frame + 1].float()
    grid = F.affine_grid(theta[None].to(video.device), list(image.shape), align_corners=False)
    warped = F.grid_sample(image, grid, mode="bilinear", padding_mode="reflection", align_corners=False)
    out[frame] = warped[0].to(video.dtype)
    return out, [frame]


def _warp(frames: torch.Tensor, i: int, kind: int, generator: torch.Generator | None) -> tuple[torch.Tensor, list[int]]:
    """Sample ``i`` of the batch warped by ``NEGATIVE_WARPS[kind]``, and the frames the warp wrote."""
    if kind == BATCH_FRAME_SWAP:
        return _batch_frame_swap(frames, i, generator)
    if kind == FRAME_SHUFFLE:
        return _frame_shuffle(frames[i], generator)
    if kind == COLOR_SHIFT:
        return _color_shift(frames[i], generator)
    return _random_affine(frames[i], generator, MAX_ANGLE, MAX_TRANSLATE, MAX_SCALE)


# What comes back follows from ``return_changed``.
@overload
def consistency_negatives(
    frames: torch.Tensor,
    probs: tuple[float, ...] = ...,
    generator: torch.Generator | None = ...,
    return_changed: Literal[False] = ...,
) -> tuple[torch.Tensor, torch.Tensor]: ...


@overload
def consistency_negatives(
    frames: torch.Tensor,
    probs: tuple[float, ...] = ...,
    generator: torch.Generator | None = ...,
    *,
    return_changed: Literal[True],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


def consistency_negatives(
    frames: torch.Tensor,
    probs: tuple[float, ...] = (0.25, 0.25, 0.25, 0.25),
    generator: torch.Generator | None = None,
    return_changed: bool = False,
) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Warp every sample of a batch of procedures by one randomly chosen warp.

    Args:
        frames: (B, T, 3, S, S) images in [0, 1].
        probs: probabilities over ``NEGATIVE_WARPS`` (batch_frame_swap, frame_shuffle, color_shift, affine).
        generator: optional CPU generator for reproducible draws.
        return_changed: also return which frames each warp wrote.

    Returns:
        ``(negatives, kinds)``: (B, T, 3, S, S) warped frames (no gradient) and (B,) int64 indices into
        ``NEGATIVE_WARPS`` saying which warp each sample got; with ``return_changed`` also a (B, T) bool CPU tensor,
        True where a warp wrote the frame (known from the draws, so reading it never waits on the device).
    """
    if frames.dim() != 5:
        raise ValueError(f"frames must be (B, T, 3, S, S), got {tuple(frames.shape)}")
    frames = frames.detach()
    weights = torch.tensor(probs, dtype=torch.float32)
    kinds = torch.multinomial(weights.expand(frames.shape[0], -1), 1, generator=generator).squeeze(1)
    out = []
    changed = torch.zeros(frames.shape[:2], dtype=torch.bool)
    for i in range(frames.shape[0]):
        kind = int(kinds[i])
        if kind == BATCH_FRAME_SWAP and frames.shape[0] < 2:
            kind = FRAME_SHUFFLE
            kinds[i] = kind
        video, written = _warp(frames, i, kind, generator)
        out.append(video)
        changed[i, written] = True
    return (torch.stack(out), kinds, changed) if return_changed else (torch.stack(out), kinds)
