"""Loss values on tiny hand-made inputs, against formulas written out by hand."""

from __future__ import annotations

import math

import torch

from procap.model.losses import caption_loss, msm_loss, pair_bce


def _ce(logits: list[float], target: int) -> float:
    return -math.log(math.exp(logits[target]) / sum(math.exp(v) for v in logits))


def test_msm_loss_is_ce_over_masked_positions_only():
    logits = torch.tensor([[[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]], [[1.0, 1.0, 1.0], [-2.0, 4.0, 0.0]]])  # (B=2, N=2, K=3)
    targets = torch.tensor([[0, 1], [2, 1]])
    mask = torch.tensor([[True, False], [True, True]])
    loss, accuracy = msm_loss(logits, targets, mask)
    expected = (_ce([2.0, 0.0, -1.0], 0) + _ce([1.0, 1.0, 1.0], 2) + _ce([-2.0, 4.0, 0.0], 1)) / 3
    assert math.isclose(loss.item(), expected, rel_tol=1e-6)
    assert math.isclose(accuracy.item(), 2 / 3, rel_tol=1e-6)  # position (1, 0) is a three-way tie -> index 0


def test_msm_loss_with_nothing_masked_is_zero_and_differentiable():
    logits = torch.randn(2, 5, 7, requires_grad=True)
    loss, accuracy = msm_loss(logits, torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 5, dtype=torch.bool))
    assert loss.item() == 0.0 and accuracy.item() == 0.0
    loss.backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))


def test_pair_bce_matches_hand_formula():
    pos = torch.tensor([1.5, -0.5, 2.0])
    neg = torch.tensor([-1.0, 0.3, 5.0])
    valid = torch.tensor([True, True, False])

    def sig(x: float) -> float:
        return 1 / (1 + math.exp(-x))

    expected = (-math.log(sig(1.5)) - math.log(1 - sig(-1.0)) - math.log(sig(-0.5)) - math.log(1 - sig(0.3))) / 2
    loss, accuracy = pair_bce(pos, neg, valid)
    assert math.isclose(loss.item(), expected, rel_tol=1e-6)
    assert math.isclose(accuracy.item(), 2 / 4)  # sample 0: both right; sample 1: both wrong; sample 2 ignored


def test_pair_bce_without_valid_samples_is_zero():
    loss, accuracy = pair_bce(torch.randn(3), torch.randn(3), torch.zeros(3, dtype=torch.bool))
    assert loss.item() == 0.0 and accuracy.item() == 0.0


def test_caption_loss_label_smoothing_and_pad():
    logits = torch.tensor([[[1.0, 2.0, 0.0, -1.0], [0.0, 0.0, 3.0, 0.0], [9.0, 9.0, 9.0, 9.0]]])  # (1, 3, V=4)
    targets = torch.tensor([[1, 2, 0]])  # last target is PAD (id 0): ignored
    eps = 0.1
    expected = 0.0
    for row, target in (([1.0, 2.0, 0.0, -1.0], 1), ([0.0, 0.0, 3.0, 0.0], 2)):
        log_probs = [-_ce(row, j) for j in range(4)]
        expected += -(1 - eps) * log_probs[target] - eps / 4 * sum(log_probs)
    loss, accuracy = caption_loss(logits, targets, pad_id=0, label_smoothing=eps)
    assert math.isclose(loss.item(), expected / 2, rel_tol=1e-6)
    assert accuracy.item() == 1.0
