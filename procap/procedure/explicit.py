"""Explicit procedure captioning (paper Table 8): synthesize the procedure at inference time.

Instead of the k * n_I learnable procedure queries, the stage-2 encoder sees real frames: l frames are
interpolated between before and after, scored, k are sampled, and ``ProCap.memory(before, after,
frames=...)`` encodes [before, keyframes, after]. It is the slow baseline the implicit (query) path and
``procap.fast`` are compared against.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from procap.procedure.interpolate import FlowInterpolator, Interpolator, generate_procedure
from procap.procedure.sampling import confidence_weights, sample_keyframes
from procap.procedure.similarity import Similarity, VQGANSimilarity

if TYPE_CHECKING:
    from procap.model.procap import ProCap


@torch.no_grad()
def explicit_frames(
    befores: torch.Tensor,
    afters: torch.Tensor,
    interpolator: Interpolator,
    similarity: Similarity,
    num_keyframes: int,
    num_generated: int = 7,
    sampling: str = "topk",
    generator: torch.Generator | None = None,
    keys: Sequence[Any] | None = None,
) -> torch.Tensor:
    """Synthesize, score and sample the keyframes of a batch of pairs.

    Args:
        befores, afters: (B, 3, S, S) float in [0, 1].
        interpolator: midpoint interpolator (see :mod:`procap.procedure.interpolate`).
        similarity: a :class:`Similarity`; with look-up similarities pass ``keys`` (one per pair).
        num_keyframes: keyframes per pair.
        num_generated: l, generated frames (3, 7 or 15).
        sampling: ``"topk"`` or ``"multinomial"``.
        generator: random generator for ``"multinomial"``.
        keys: optional per-pair keys for the similarity.

    Returns:
        (B, num_keyframes + 2, 3, S, S): before, the keyframes in temporal order, after.
    """
    mids = generate_procedure(befores, afters, interpolator, num_generated).to(befores.device)  # (B, l, 3, S, S)
    frames = torch.cat([befores[:, None].float(), mids, afters[:, None].float()], dim=1)  # (B, l + 2, 3, S, S)
    if keys is None:
        s_bef, s_aft = similarity(frames)  # (B, l + 2) each
    else:
        pairs = [similarity(f, key) for f, key in zip(frames, keys)]
        s_bef = torch.stack([p[0] for p in pairs])
        s_aft = torch.stack([p[1] for p in pairs])
    weights = confidence_weights(s_bef, s_aft)  # (B, l)
    chosen = [sample_keyframes(w, num_keyframes, sampling, generator) for w in weights]
    return torch.stack([f[idx.to(f.device)] for f, idx in zip(frames, chosen)])


def _defaults(
    model: ProCap,
    interpolator: Interpolator | None,
    similarity: Similarity | None,
    num_keyframes: int | None,
    num_generated: int | None,
) -> tuple[Interpolator, Similarity, int, int]:
    config = model.config
    interpolator = interpolator or FlowInterpolator()
    similarity = similarity or VQGANSimilarity(model.vqgan)
    num_keyframes = config.num_keyframes if num_keyframes is None else num_keyframes
    if num_keyframes != config.num_keyframes:
        # the positional embeddings are per frame: the model was built for T = num_keyframes + 2
        raise ValueError(f"the model was built for num_keyframes = {config.num_keyframes}, got {num_keyframes}")
    return interpolator, similarity, num_keyframes, num_generated or config.num_generated_frames


@torch.no_grad()
def explicit_memory(
    model: ProCap,
    before: torch.Tensor,
    after: torch.Tensor,
    interpolator: Interpolator | None = None,
    similarity: Similarity | None = None,
    num_keyframes: int | None = None,
    num_generated: int | None = None,
    sampling: str = "topk",
) -> torch.Tensor:
    """Decoder memory of ``model`` from synthesized frames: (B, 3, S, S) x 2 -> (B, (k + 2) * n, dec_dim), k the
    model's ``num_keyframes``.

    Defaults: :class:`FlowInterpolator`, cosine similarity of the model's own frozen VQGAN features,
    num_keyframes and l from the model's config.
    """
    interpolator, similarity, num_keyframes, num_generated = _defaults(
        model, interpolator, similarity, num_keyframes, num_generated
    )
    frames = explicit_frames(before, after, interpolator, similarity, num_keyframes, num_generated, sampling)
    return model.memory(before, after, frames=frames.to(before.dtype))


@torch.no_grad()
def explicit_captions(
    model: ProCap,
    befores: torch.Tensor,
    afters: torch.Tensor,
    interpolator: Interpolator | None = None,
    similarity: Similarity | None = None,
    num_keyframes: int | None = None,
    num_generated: int | None = None,
    max_len: int | None = None,
    sampling: str = "topk",
) -> torch.Tensor:
    """Greedy captions with explicit procedures (paper Table 8).

    Args:
        model: a :class:`procap.model.procap.ProCap`.
        befores, afters: (B, 3, S, S) float in [0, 1].
        interpolator, similarity, num_keyframes, num_generated, sampling: see :func:`explicit_memory`.
        max_len: caption length including BOS (default: the model's).

    Returns:
        (B, max_len - 1) int64 tokens, as :meth:`ProCap.generate`.
    """
    was_training = model.training
    model.eval()
    try:
        memory = explicit_memory(
            model, befores, afters, interpolator, similarity, num_keyframes, num_generated, sampling
        )
        return model.generate_from_memory(memory, max_len)
    finally:
        model.train(was_training)
