"""Image loading: the one preprocessing shared by training, evaluation, procedures and ``procap.fast``."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from procap.errors import ProCapError


def to_tensor(image: Image.Image, size: int) -> torch.Tensor:
    """PIL image -> (3, size, size) float32 in [0, 1]: RGB, bicubic resize (skipped when already that size)."""
    image = image.convert("RGB")
    if image.size != (size, size):
        image = image.resize((size, size), Image.BICUBIC)
    array = np.asarray(image, dtype=np.uint8)
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float().div_(255.0)


def load_image(path: str | os.PathLike, size: int) -> torch.Tensor:
    """Read an image file (png, jpg, gif, ...) as a (3, size, size) float tensor in [0, 1].

    Raises:
        ProCapError: naming the file when it is missing or cannot be decoded.
    """
    path = Path(path)
    if not path.is_file():
        raise ProCapError(f"image {path} does not exist.")
    try:
        with Image.open(path) as image:
            image.seek(0)  # first frame of an animated gif
            return to_tensor(image, size)
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise ProCapError(f"image {path} could not be read ({exc}).") from None
