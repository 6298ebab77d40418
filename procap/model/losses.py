"""Stage-1 and stage-2 losses as small pure functions (so tests can check them on hand-made logits)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def msm_loss(
    logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked sequence modeling: cross-entropy over masked positions only.

    With a mask, every position's cross-entropy is computed and weighted by the mask (no boolean gather, whose
    size the host would have to read from the device).

    Args:
        logits: (B, N, K) code logits, or (M, K) already gathered at the masked positions.
        targets: (B, N) or (M,) codebook indices.
        mask: (B, N) bool, True = masked (contributes to the loss); None = every given position counts.

    Returns:
        ``(loss, accuracy)``: mean CE over masked positions and the argmax accuracy there. With nothing masked
        both are 0, and the loss stays connected to ``logits`` (zero gradient) so ``backward`` works.
    """
    flat_logits, flat_targets = logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1)
    weight = torch.ones_like(flat_targets, dtype=torch.float32) if mask is None else mask.reshape(-1).float()
    count = weight.sum().clamp(min=1.0)
    loss = (F.cross_entropy(flat_logits, flat_targets, reduction="none") * weight).sum() / count
    correct = (flat_logits.argmax(-1) == flat_targets).float() * weight
    return loss, (correct.sum() / count).detach()


def pair_bce(
    pos_logits: torch.Tensor, neg_logits: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Binary loss of a positive/negative pair per sample, as the authors weigh it.

    ``sum_b valid_b * (BCE(pos_b, 1) + BCE(neg_b, 0)) / max(1, sum_b valid_b)``: the positive and its negative
    each count fully, averaged over the valid samples (those not fully masked, with a true negative).

    Args:
        pos_logits, neg_logits: (B,) logits.
        valid: (B,) bool.

    Returns:
        ``(loss, accuracy)``; accuracy over the 2 * valid decisions (logit > 0 means positive).
    """
    weight = valid.float()
    pos = F.binary_cross_entropy_with_logits(pos_logits.float(), torch.ones_like(weight), reduction="none")
    neg = F.binary_cross_entropy_with_logits(neg_logits.float(), torch.zeros_like(weight), reduction="none")
    count = weight.sum().clamp(min=1.0)
    loss = ((pos + neg) * weight).sum() / count
    correct = ((pos_logits > 0).float() + (neg_logits <= 0).float()) * weight
    return loss, (correct.sum() / (2.0 * count)).detach()


def caption_loss(
    logits: torch.Tensor, targets: torch.Tensor, pad_id: int, label_smoothing: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced caption cross-entropy with label smoothing, PAD targets ignored.

    Args:
        logits: (B, L, V); targets: (B, L) next-token ids.

    Returns:
        ``(loss, accuracy)`` over non-PAD targets.
    """
    flat_logits, flat_targets = logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1)
    loss = F.cross_entropy(flat_logits, flat_targets, ignore_index=pad_id, label_smoothing=label_smoothing)
    keep = flat_targets != pad_id
    accuracy = (flat_logits.argmax(-1)[keep] == flat_targets[keep]).float().mean() if keep.any() else loss * 0.0
    return loss, accuracy.detach()
