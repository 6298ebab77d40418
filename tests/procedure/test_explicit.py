from __future__ import annotations

import pytest
import torch

from procap.core.config import get_preset
from procap.procedure.explicit import explicit_captions, explicit_frames
from procap.procedure.interpolate import CrossFade
from procap.procedure.similarity import VQGANSimilarity


@pytest.fixture(scope="module")
def model():
    from procap.model.procap import ProCap

    torch.manual_seed(0)
    return ProCap(get_preset("tiny", enc_layers=1, dec_layers=1)).eval()


def test_explicit_frames_are_framed_and_ordered(model):
    before, after = torch.zeros(2, 3, 64, 64), torch.ones(2, 3, 64, 64)
    frames = explicit_frames(before, after, CrossFade(), VQGANSimilarity(model.vqgan), num_keyframes=2, num_generated=7)
    assert frames.shape == (2, 4, 3, 64, 64)
    torch.testing.assert_close(frames[:, 0], before)
    torch.testing.assert_close(frames[:, -1], after)
    levels = frames[:, :, 0, 0, 0]  # a cross-fade frame's value is its time
    assert torch.all(levels[:, 1:] > levels[:, :-1])


def test_explicit_captions_use_the_synthesized_frames(model, monkeypatch):
    before, after = torch.rand(2, 3, 64, 64), torch.rand(2, 3, 64, 64)
    seen = {}
    original = model.memory

    def spy(b, a, frames=None):
        seen["frames"] = frames
        return original(b, a, frames=frames)

    monkeypatch.setattr(model, "memory", spy)
    tokens = explicit_captions(model, before, after, interpolator=CrossFade(), max_len=8)
    assert tokens.shape == (2, 7) and tokens.dtype == torch.int64
    assert seen["frames"].shape == (2, 4, 3, 64, 64)
    monkeypatch.setattr(model, "memory", original)
    expected = model.generate(before, after, max_len=8, frames=seen["frames"])
    assert torch.equal(tokens, expected)


def test_explicit_k_must_match_the_model(model):
    with pytest.raises(ValueError, match="num_keyframes = 2, got 3"):
        before, after = torch.rand(1, 3, 64, 64), torch.rand(1, 3, 64, 64)
        explicit_captions(model, before, after, interpolator=CrossFade(), num_keyframes=3)
