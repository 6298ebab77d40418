"""Fixtures of the command tests: a trained tiny checkpoint and folders of image pairs to caption."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from tests.support import CAPTION_PAIRS


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory, trained, vocab):
    """The trained tiny model (tests/conftest.py) saved as a checkpoint file."""
    from procap.loading.checkpoint import save_checkpoint

    path = tmp_path_factory.mktemp("ckpt") / "tiny.safetensors"
    save_checkpoint(path, trained[0], vocab)
    return path


@pytest.fixture()
def folders(tmp_path, pairs):
    """``CAPTION_PAIRS`` pairs as ``before/NAME.png`` and ``after/NAME.png`` under ``tmp_path``; the two folders."""
    before_dir, after_dir = tmp_path / "before", tmp_path / "after"
    for folder, batch in zip((before_dir, after_dir), pairs):
        folder.mkdir()
        for index in range(CAPTION_PAIRS):
            array = (batch[index].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
            Image.fromarray(array).save(folder / f"pair{index}.png")
    return before_dir, after_dir
