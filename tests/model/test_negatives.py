"""Consistency negatives: every warp produces its own kind of change and nothing else."""

from __future__ import annotations

import itertools

import pytest
import torch

from procap.model.negatives import (
    AFFINE,
    BATCH_FRAME_SWAP,
    COLOR_SHIFT,
    FRAME_SHUFFLE,
    affine_matrix,
    consistency_negatives,
)


def _frames(batch: int = 3, num_frames: int = 4, size: int = 8) -> torch.Tensor:
    # Distinct, mid-range frames so that every warp is visible and none saturates.
    return 0.25 + 0.5 * torch.rand(batch, num_frames, 3, size, size)


def _only(kind: int) -> tuple[float, ...]:
    return tuple(1.0 if i == kind else 0.0 for i in range(4))


def _changed_frames(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a != b).flatten(2).any(-1)  # (B, T)


def test_batch_frame_swap_takes_one_frame_from_another_sample():
    frames = _frames()
    out, kinds = consistency_negatives(frames, _only(BATCH_FRAME_SWAP))
    assert (kinds == BATCH_FRAME_SWAP).all()
    changed = _changed_frames(out, frames)
    assert (changed.sum(1) == 1).all()
    for b, t in changed.nonzero().tolist():
        sources = [(i, j) for i, j in itertools.product(range(3), range(4)) if torch.equal(out[b, t], frames[i, j])]
        assert sources and all(i != b for i, _ in sources)


def test_frame_shuffle_is_a_non_identity_permutation():
    frames = _frames(batch=64, num_frames=3, size=2)
    out, kinds = consistency_negatives(frames, _only(FRAME_SHUFFLE))
    assert (kinds == FRAME_SHUFFLE).all()
    seen = set()
    for b in range(frames.shape[0]):
        perm = tuple(next(j for j in range(3) if torch.equal(out[b, t], frames[b, j])) for t in range(3))
        assert sorted(perm) == [0, 1, 2] and perm != (0, 1, 2)
        seen.add(perm)
    assert len(seen) == 5  # all non-identity permutations of 3 frames occur


def test_two_frames_shuffle_to_a_swap():
    frames = _frames(batch=4, num_frames=2)
    out, _ = consistency_negatives(frames, _only(FRAME_SHUFFLE))
    assert torch.equal(out, frames.flip(1))


def test_color_shift_changes_one_channel_of_one_frame():
    frames = _frames(batch=16)
    out, kinds = consistency_negatives(frames, _only(COLOR_SHIFT))
    assert (kinds == COLOR_SHIFT).all()
    planes = (out != frames).flatten(3).any(-1)  # (B, T, 3)
    assert (planes.flatten(1).sum(1) == 1).all()
    delta = (out - frames).flatten(1)
    shift = delta.gather(1, delta.abs().argmax(1, keepdim=True)).squeeze(1)
    assert ((shift.abs() >= 0.1 - 1e-6) & (shift.abs() <= 0.5 + 1e-6)).all()
    assert out.min() >= 0 and out.max() <= 1


def test_affine_warps_exactly_one_frame():
    frames = _frames(batch=4, size=16)
    out, kinds = consistency_negatives(frames, _only(AFFINE))
    assert (kinds == AFFINE).all()
    changed = _changed_frames(out, frames)
    assert (changed.sum(1) == 1).all()
    assert ((out - frames).abs().flatten(1).amax(1) > 0.05).all()  # a real change, not rounding noise


def test_identity_affine_matrix_keeps_the_image():
    image = torch.rand(1, 3, 8, 8)
    grid = torch.nn.functional.affine_grid(affine_matrix(0.0, (0.0, 0.0), 1.0)[None], [1, 3, 8, 8], align_corners=False)
    out = torch.nn.functional.grid_sample(image, grid, padding_mode="reflection", align_corners=False)
    torch.testing.assert_close(out, image)


def test_batch_of_one_falls_back_to_shuffle():
    frames = _frames(batch=1)
    out, kinds = consistency_negatives(frames, _only(BATCH_FRAME_SWAP))
    assert kinds.tolist() == [FRAME_SHUFFLE]
    assert not torch.equal(out, frames)


def test_warp_frequencies_follow_the_probabilities():
    frames = _frames(batch=400, num_frames=2, size=2)
    generator = torch.Generator().manual_seed(1)
    _, kinds = consistency_negatives(frames, (0.1, 0.2, 0.3, 0.4), generator)
    freq = torch.bincount(kinds, minlength=4).float() / 400
    torch.testing.assert_close(freq, torch.tensor([0.1, 0.2, 0.3, 0.4]), atol=0.06, rtol=0)


def test_generator_makes_negatives_reproducible():
    frames = _frames()
    a = consistency_negatives(frames, generator=torch.Generator().manual_seed(3))
    b = consistency_negatives(frames, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_rejects_wrong_rank():
    with pytest.raises(ValueError, match="B, T, 3, S, S"):
        consistency_negatives(torch.rand(2, 3, 8, 8))


@pytest.mark.parametrize("kind", [BATCH_FRAME_SWAP, FRAME_SHUFFLE, COLOR_SHIFT, AFFINE])
def test_changed_frames_are_reported_from_the_draws(kind):
    # Stage 1 re-encodes only these frames; the CPU mask must equal the frames that really differ.
    frames = _frames(batch=4)
    out, _, changed = consistency_negatives(frames, _only(kind), torch.Generator().manual_seed(kind), True)
    assert changed.device.type == "cpu" and changed.dtype == torch.bool
    assert torch.equal(changed, _changed_frames(out, frames))


def test_reporting_changed_frames_keeps_the_draws():
    frames = _frames()
    a, kinds_a = consistency_negatives(frames, generator=torch.Generator().manual_seed(5))
    b, kinds_b, _ = consistency_negatives(frames, generator=torch.Generator().manual_seed(5), return_changed=True)
    assert torch.equal(a, b) and torch.equal(kinds_a, kinds_b)
