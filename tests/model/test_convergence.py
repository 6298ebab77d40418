"""Short training runs: the model can fit a handful of examples (catches wiring errors that shape tests miss)."""

from __future__ import annotations

import torch

from procap.model.procap import ProCap
from tests.support import random_captions, small_config


def _setup():
    config = small_config()
    model = ProCap(config)
    g = torch.Generator().manual_seed(0)
    frames = torch.rand(4, config.num_frames, 3, 16, 16, generator=g)
    captions = random_captions(4, 8, config.vocab_size, g)
    params = [p for p in model.parameters() if p.requires_grad]
    return model, frames, captions, params


def test_stage2_memorises_four_captions():
    model, frames, captions, params = _setup()
    optimizer = torch.optim.Adam(params, lr=3e-3)
    for _ in range(120):
        loss = model.stage2_loss(frames[:, 0], frames[:, -1], captions)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert torch.equal(model.generate(frames[:, 0], frames[:, -1]), captions[:, 1:])


def test_stage1_msm_loss_goes_down():
    model, frames, captions, params = _setup()
    optimizer = torch.optim.Adam(params, lr=1e-3)
    masks = model.sample_mask_params(4, "cpu", torch.Generator().manual_seed(2))
    losses = []
    for _ in range(30):
        out = model.stage1_loss(frames, captions, mask_params=masks)
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
        losses.append(out["msm"].item())
    assert losses[-1] < 0.8 * losses[0]
