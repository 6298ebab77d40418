"""Fixtures over the authors' reduced-size checkpoint (``tests/convert/data/clevr_like``; paths in tests/support.py)."""

from __future__ import annotations

import pytest
import torch

from tests.support import AUTHORS_CHECKPOINT, AUTHORS_VOCAB, authors_image_paths


@pytest.fixture(scope="session")
def authors_model():
    """``(model, vocab)``: the converted checkpoint in fp32 eval mode on the CPU."""
    from procap.convert import convert_authors_checkpoint

    model, vocab, _ = convert_authors_checkpoint(AUTHORS_CHECKPOINT, AUTHORS_VOCAB)
    return model, vocab


@pytest.fixture(scope="session")
def fixture_images():
    """``(before, after)``: (8, 3, 224, 224) float images read through procap's own loader."""
    from procap.data import load_image

    befores, afters = authors_image_paths()
    return (torch.stack([load_image(p, 224) for p in befores]), torch.stack([load_image(p, 224) for p in afters]))
