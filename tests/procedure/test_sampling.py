from __future__ import annotations

import math

import pytest
import torch

from procap.core.errors import ProCapError
from procap.procedure.sampling import confidence_weights, sample_keyframes


def test_score_formula_by_hand():
    s_bef = torch.tensor([1.0, 0.8, 0.5, 0.2, 0.0])
    s_aft = torch.tensor([0.0, 0.2, 0.5, 0.8, 1.0])
    # intermediates: (0.8-0.2)^2 = 0.36, 0, 0.36 -> softmax -> w = 1 - softmax
    z = 2 * math.exp(0.36) + 1.0
    expected = torch.tensor([1 - math.exp(0.36) / z, 1 - 1 / z, 1 - math.exp(0.36) / z])
    torch.testing.assert_close(confidence_weights(s_bef, s_aft, scale="paper"), expected)
    # the middle frame (equally far from both ends) is the most confident
    assert int(confidence_weights(s_bef, s_aft).argmax()) == 1


def test_standardized_scores_by_hand():
    s_bef = torch.tensor([1.0, 0.8, 0.5, 0.2, 0.0])
    s_aft = torch.tensor([0.0, 0.2, 0.5, 0.8, 1.0])
    # d^2 = 0.36, 0, 0.36: mean 0.24, population std 0.1697 -> standardised (0.7071, -1.4142, 0.7071)
    z = torch.tensor([0.5**0.5, -(2**0.5), 0.5**0.5], dtype=torch.float64)
    expected = (1 - torch.softmax(z, 0)).float()
    torch.testing.assert_close(confidence_weights(s_bef, s_aft), expected)


def test_standardized_scores_discriminate_near_one_similarities():
    # a tokenizer's cosine similarities sit within ~0.002 of 1: the paper's softmax is flat there (1 - 1/l for every
    # frame, the float32 rounding decides top-k), the standardised one keeps the frames apart in the same order
    t = torch.linspace(0, 1, 9, dtype=torch.float64)
    s_bef = (1 - 0.002 * t).float()
    s_aft = (1 - 0.002 * (1 - t) - 0.0003 * (t - 0.7).abs()).float()  # the true midpoint is off-centre
    paper = confidence_weights(s_bef, s_aft, scale="paper")
    assert (paper - 6 / 7).abs().max() < 1e-6
    standard = confidence_weights(s_bef, s_aft)
    assert standard.max() - standard.min() > 0.3
    d2 = ((s_bef.double() - s_aft.double()) ** 2)[1:-1]
    assert torch.equal(standard.argsort(descending=True), (-d2).argsort(descending=True))
    # equal differences stay equal (uniform weights), and the scale name is checked
    flat = confidence_weights(torch.ones(5), torch.ones(5))
    torch.testing.assert_close(flat, torch.full((3,), 2 / 3))
    with pytest.raises(ValueError, match="scale"):
        confidence_weights(s_bef, s_aft, scale="temperature")


def test_score_formula_batched_and_sum():
    s_bef, s_aft = torch.rand(4, 9), torch.rand(4, 9)
    w = confidence_weights(s_bef, s_aft)
    assert w.shape == (4, 7)
    torch.testing.assert_close(w.sum(-1), torch.full((4,), 6.0))  # softmax sums to 1: sum(1 - p) = l - 1


def test_score_shape_errors():
    with pytest.raises(ValueError):
        confidence_weights(torch.rand(9), torch.rand(8))


def test_topk_keeps_temporal_order_and_frames_ends():
    w = torch.tensor([0.1, 0.9, 0.3, 0.95, 0.2, 0.8, 0.4])
    idx = sample_keyframes(w, 3, "topk")
    assert idx.tolist() == [0, 2, 4, 6, 8]  # frames 1, 3, 5 of the intermediates, +1 for "before", in order


def test_topk_ties_prefer_earlier():
    assert sample_keyframes(torch.ones(7), 2, "topk").tolist() == [0, 1, 2, 8]


def test_multinomial_is_deterministic_sorted_and_follows_weights():
    w = torch.tensor([0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    seen = set()
    for seed in range(20):
        idx = sample_keyframes(w, 2, "multinomial", torch.Generator().manual_seed(seed))
        assert idx[0] == 0 and idx[-1] == 8 and torch.all(idx[1:] > idx[:-1])
        seen.add(tuple(idx.tolist()))
    assert seen == {(0, 3, 5, 8)}  # only the two non-zero frames can be drawn
    w = torch.rand(7)
    a = sample_keyframes(w, 3, "multinomial", torch.Generator().manual_seed(1))
    b = sample_keyframes(w, 3, "multinomial", torch.Generator().manual_seed(1))
    assert a.shape == (5,) and torch.equal(a, b)


def test_k_zero_and_bounds():
    assert sample_keyframes(torch.rand(7), 0).tolist() == [0, 8]
    with pytest.raises(ProCapError, match="num_keyframes must be at most l = 7"):  # validate.keyframe_count
        sample_keyframes(torch.rand(7), 8)
    with pytest.raises(ValueError):
        sample_keyframes(torch.rand(7), 2, "random")
