"""Confidence-based keyframe sampling (paper section 3.2, and the authors' ``get_filter_indices``).

Given similarities of every frame of a procedure to the before and the after image, the confidence of an
intermediate frame P is ``w = 1 - softmax((s(I_bef, P) - s(I_aft, P))^2)`` over the l intermediates (by default
with the squared differences standardised per procedure first, see :func:`confidence_weights`): a frame
that is as close to the start as to the end (a genuine "in between") scores high, a frame that still looks
like one of the two ends scores low. k keyframes are then drawn from w (top-k, or multinomial without
replacement as the authors' loader does), kept in temporal order and framed by before and after.
"""

from __future__ import annotations

import torch

from procap.core import validate
from procap.core.config import KEYFRAME_SAMPLING

CONFIDENCE_SCALES = ("standardize", "paper")


def confidence_weights(s_bef: torch.Tensor, s_aft: torch.Tensor, scale: str = "standardize") -> torch.Tensor:
    """``w = 1 - softmax(d^2)`` over the intermediate frames, ``d = s_bef - s_aft``.

    ``scale`` "paper" applies the formula to ``d^2`` as it is. "standardize" (the default) first standardises the l
    values of ``d^2`` per procedure (zero mean, unit standard deviation). Cosine similarities of one tokenizer's
    features lie within about 0.002 of 1, so ``d^2`` is ~1e-6 and the paper's softmax is flat: every weight is
    ``1 - 1/l`` up to float rounding, multinomial sampling draws uniformly and top-k falls back to the earliest
    frames on ties. Standardising keeps the paper's order of the frames (it is monotonic in ``d^2``) and makes the
    weights differ by a useful amount whatever the similarity's scale. Both are computed in float64.

    Args:
        s_bef: (..., l + 2) similarity of frames [before, P_1..P_l, after] to the before image.
        s_aft: (..., l + 2) similarity of the same frames to the after image.
        scale: one of :data:`CONFIDENCE_SCALES`.

    Returns:
        (..., l) float32 weights in [0, 1) for P_1..P_l (they sum to l - 1).
    """
    if s_bef.shape != s_aft.shape or s_bef.shape[-1] < 3:
        raise ValueError(
            f"s_bef and s_aft must have the same shape (..., l + 2) with l >= 1, got "
            f"{tuple(s_bef.shape)} and {tuple(s_aft.shape)}"
        )
    if scale not in CONFIDENCE_SCALES:
        raise ValueError(f"confidence scale must be one of {CONFIDENCE_SCALES}, got {scale!r}")
    diff2 = ((s_bef.double() - s_aft.double()) ** 2)[..., 1:-1]
    if scale == "standardize":
        spread = diff2.std(dim=-1, unbiased=False, keepdim=True)
        # equal values (or l = 1) carry no preference: they stay equal, which gives uniform weights
        diff2 = (diff2 - diff2.mean(dim=-1, keepdim=True)) / spread.clamp_min(1e-300)
    return (1.0 - torch.softmax(diff2, dim=-1)).float()


def sample_keyframes(
    weights: torch.Tensor, num_keyframes: int, mode: str = "topk", generator: torch.Generator | None = None
) -> torch.Tensor:
    """Pick num_keyframes of the l intermediate frames and frame them by before and after.

    Args:
        weights: (l,) confidences from :func:`confidence_weights`.
        num_keyframes: number of keyframes, 0 <= num_keyframes <= l.
        mode: ``"topk"`` (the most confident; ties go to the earlier frame) or ``"multinomial"`` (drawn
            in proportion to the weights without replacement, deterministic for a given ``generator``).
        generator: torch random generator for ``"multinomial"``.

    Returns:
        (num_keyframes + 2,) int64 indices into the l + 2 stored frames: 0, the chosen frames in temporal order,
        l + 1.
    """
    if weights.dim() != 1:
        raise ValueError(f"weights must be a vector (l,), got shape {tuple(weights.shape)}")
    num = weights.shape[0]
    validate.keyframe_count(num_keyframes, "num_keyframes", frames=num)
    if mode not in KEYFRAME_SAMPLING:
        raise ValueError(f"sampling mode must be one of {KEYFRAME_SAMPLING}, got {mode!r}")
    w = weights.detach().float().cpu()
    if num_keyframes == 0:
        chosen = torch.zeros(0, dtype=torch.long)
    elif mode == "topk":
        # stable sort: equal weights keep temporal order, so the result does not depend on the platform
        chosen = torch.sort(-w, stable=True).indices[:num_keyframes]
    else:
        probs = w.clamp_min(0.0)
        if float(probs.sum()) <= 0.0:  # degenerate (e.g. l = 1 gives w = 0): fall back to uniform
            probs = torch.ones_like(w)
        # multinomial needs enough non-zero entries for sampling without replacement
        probs = probs + (probs == 0).float() * 1e-12
        chosen = torch.multinomial(probs, num_keyframes, replacement=False, generator=generator)
    middle = torch.sort(chosen).values + 1
    return torch.cat([torch.zeros(1, dtype=torch.long), middle, torch.full((1,), num + 1, dtype=torch.long)])
