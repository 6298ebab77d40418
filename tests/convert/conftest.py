"""The authors' reduced-size checkpoint and what their code computed from it (``tests/convert/data/clevr_like``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

DATA = Path(__file__).parent / "data" / "clevr_like"
CHECKPOINT = DATA / "model.chkpt"
VOCAB = DATA / "clevr_word2idx.json"
PAIRS = 8


def expected(name: str) -> torch.Tensor:
    """One of the authors' recorded arrays (``expected/<name>.npy``) as a tensor."""
    return torch.from_numpy(np.load(DATA / "expected" / f"{name}.npy"))


def image_paths() -> tuple[list[Path], list[Path]]:
    return (
        [DATA / "images" / f"pair{i:02d}_before.png" for i in range(PAIRS)],
        [DATA / "images" / f"pair{i:02d}_after.png" for i in range(PAIRS)],
    )


def expected_captions() -> list[str]:
    return [entry["caption"] for entry in json.loads((DATA / "expected" / "captions.json").read_text())["captions"]]


@pytest.fixture(scope="session")
def authors_model():
    """``(model, vocab)``: the converted checkpoint in fp32 eval mode on the CPU."""
    from procap.convert import convert_authors_checkpoint

    model, vocab, _ = convert_authors_checkpoint(CHECKPOINT, VOCAB)
    return model, vocab


@pytest.fixture(scope="session")
def fixture_images():
    """``(before, after)``: (8, 3, 224, 224) float images read through procap's own loader."""
    from procap.data import load_image

    befores, afters = image_paths()
    return (torch.stack([load_image(p, 224) for p in befores]), torch.stack([load_image(p, 224) for p in afters]))
