"""The one image preprocessing used by training, evaluation and procap.fast."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from procap.errors import ProCapError


def load_image(path: str | os.PathLike, size: int) -> torch.Tensor:
    """Read an image (png/jpg/jpeg/gif/..., any case), convert to RGB and resize bicubically.

    Args:
        path: image file.
        size: output side in pixels.

    Returns:
        FloatTensor (3, size, size) in [0, 1].

    Raises:
        ProCapError: the file is missing or cannot be decoded.
    """
    path = Path(path)
    try:
        with Image.open(path) as im:
            im.seek(0)  # first frame of animated GIFs
            rgb = im.convert("RGB")
    except FileNotFoundError:
        raise ProCapError(f"image {path} does not exist.") from None
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise ProCapError(f"image {path} cannot be read ({exc}).") from None
    if rgb.size != (size, size):
        rgb = rgb.resize((size, size), Image.BICUBIC)
    array = np.asarray(rgb, dtype=np.uint8)  # (size, size, 3)
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float().div_(255.0)
