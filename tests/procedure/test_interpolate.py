from __future__ import annotations

import pytest
import torch

from procap.procedure.interpolate import (
    CrossFade,
    FlowInterpolator,
    backward_warp,
    forward_splat,
    generate_procedure,
    levels_for,
)
from procap.procedure.quality import psnr
from tests.support import requires_cuda, square_image, textured


def test_backward_warp_integer_shift_matches_roll():
    img = torch.rand(1, 3, 16, 16)
    flow = torch.zeros(1, 2, 16, 16)
    flow[:, 0] = 3.0  # sample three pixels to the right
    out = backward_warp(img, flow)
    torch.testing.assert_close(out[..., :13], img[..., 3:])


def test_forward_splat_conserves_mass_and_moves_values():
    values = torch.rand(2, 3, 12, 12)
    flow = torch.zeros(2, 2, 12, 12)
    flow[:, 1] = 2.0  # two rows down
    sums, weight = forward_splat(values, flow, torch.ones(2, 1, 12, 12))
    torch.testing.assert_close(sums[:, :, 2:], values[:, :, :10])
    assert float(weight[:, :, :2].sum()) == 0.0


def test_global_translation_midpoint():
    """The midpoint of a textured image shifted by (6, 4) px is the image shifted by (3, 2) px."""
    before, after, truth = textured(0, 0), textured(6, 4), textured(3, 2)
    mid = FlowInterpolator()(before[None], after[None])[0]
    inner = (slice(None), slice(8, -8), slice(8, -8))  # borders enter/leave the window
    flow_db = float(psnr(mid[inner][None], truth[inner][None]))
    fade_db = float(psnr(CrossFade()(before[None], after[None])[0][inner][None], truth[inner][None]))
    assert flow_db > 35.0, flow_db
    assert flow_db > fade_db + 10.0


def test_moving_object_midpoint_beats_crossfade():
    """A small flat square moving further than its own size (DIS alone cannot follow it)."""
    before, after, truth = square_image(7, 8), square_image(23, 20), square_image(15, 14)
    mid = FlowInterpolator()(before[None], after[None])
    fade = CrossFade()(before[None], after[None])
    assert float(psnr(mid, truth[None])) > float(psnr(fade, truth[None])) + 8.0


def test_at_endpoints_and_range():
    before, after = square_image(7, 8)[None], square_image(10, 9)[None]
    out = FlowInterpolator().at(before, after, 0.25)
    assert out.shape == before.shape and out.min() >= 0 and out.max() <= 1


@pytest.mark.parametrize("num_generated", [3, 7, 15])
def test_frame_counts_and_order(num_generated):
    before, after = torch.zeros(2, 3, 8, 8), torch.ones(2, 3, 8, 8)
    frames = generate_procedure(before, after, CrossFade(), num_generated)
    assert frames.shape == (2, num_generated, 3, 8, 8)
    # recursive midpoints of a cross-fade are the blends at t = i / (l + 1), in temporal order
    expected = torch.arange(1, num_generated + 1, dtype=torch.float32) / (num_generated + 1)
    torch.testing.assert_close(frames[0, :, 0, 0, 0], expected)


def test_unbatched_flow_procedure():
    frames = generate_procedure(square_image(7, 8), square_image(20, 14), FlowInterpolator(), 3)
    assert frames.shape == (3, 3, 32, 32)


@pytest.mark.parametrize("bad", [0, 1, 2, 5, 8, 31])
def test_invalid_frame_counts(bad):
    with pytest.raises(ValueError, match="generated frames"):
        levels_for(bad)
    with pytest.raises(ValueError):
        generate_procedure(torch.zeros(3, 8, 8), torch.ones(3, 8, 8), CrossFade(), bad)


def test_shape_mismatch_rejected():
    with pytest.raises(ValueError, match="same shape"):
        FlowInterpolator()(torch.zeros(1, 3, 8, 8), torch.zeros(1, 3, 8, 9))


def test_direct_procedure_matches_recursive_for_crossfade_and_runs_for_flow():
    before, after = torch.rand(2, 3, 16, 16), torch.rand(2, 3, 16, 16)
    torch.testing.assert_close(
        generate_procedure(before, after, CrossFade(), 7, direct=True),
        generate_procedure(before, after, CrossFade(), 7),
    )
    frames = generate_procedure(square_image(7, 8), square_image(23, 20), FlowInterpolator(), 3, direct=True)
    truth = square_image(15, 14)
    assert float(psnr(frames[1][None], truth[None])) > 25.0


def test_direct_needs_frames_at():
    with pytest.raises(ValueError, match="frames_at"):
        generate_procedure(torch.zeros(3, 8, 8), torch.ones(3, 8, 8), lambda b, a: (b + a) / 2, 3, direct=True)


@requires_cuda
def test_warping_on_cuda_matches_cpu():
    before, after = square_image(7, 8)[None], square_image(23, 20)[None]
    cpu = FlowInterpolator()(before, after)
    gpu = FlowInterpolator()(before.cuda(), after.cuda())
    assert gpu.device.type == "cuda"
    torch.testing.assert_close(gpu.cpu(), cpu, atol=2e-3, rtol=0)
